/*
 * UTF-8 for the strings gpuq writes: docs/protocol.md promises that every
 * string in a reply is valid UTF-8, and strict decoders (Python's msgpack)
 * refuse a reply that has one invalid string. Messages that echo a client's
 * bytes therefore pass through utf8_escape, which writes each byte that is
 * not part of a valid sequence as the four characters \xNN. Any thread.
 */
#ifndef GPUQ_UTF8_H
#define GPUQ_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/*
 * The length of the valid UTF-8 sequence at s[0..n), 1 to 4, or 0 when
 * there is none there: a stray continuation byte, a truncated sequence, an
 * overlong encoding, a surrogate (U+D800..U+DFFF) or a code point above
 * U+10FFFF (the rules of RFC 3629).
 */
size_t utf8_sequence(const unsigned char *s, size_t n);

/* Whether s[0..n) is entirely valid UTF-8. */
bool utf8_valid(const char *s, size_t n);

/*
 * Copies s[0..n) to out, each byte that is not part of a valid sequence as
 * \xNN (lower-case hex); out must hold 4 * n bytes. Returns the length
 * written (no NUL is added).
 */
size_t utf8_escape(const char *s, size_t n, char *out);

#endif
