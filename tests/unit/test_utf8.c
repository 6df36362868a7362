/*
 * Unit tests for protocol/utf8.c and the string builders that use it: what
 * counts as UTF-8 (as strict decoders such as Python's see it), and the
 * \xNN escape of everything else.
 */
#include "tests/harness.h"

#include "protocol/msg.h"
#include "protocol/utf8.h"

static bool valid(const char *s)
{
	return utf8_valid(s, strlen(s));
}

TEST(utf8_valid_accepts_every_well_formed_sequence)
{
	CHECK(valid(""));
	CHECK(valid("plain ascii"));
	CHECK(valid("\xc3\xa9t\xc3\xa9"));          /* été */
	CHECK(valid("\xe2\x82\xac"));               /* € U+20AC */
	CHECK(valid("\xef\xbf\xbf"));               /* U+FFFF */
	CHECK(valid("\xf0\x9f\x98\x80"));           /* U+1F600 */
	CHECK(valid("\xf4\x8f\xbf\xbf"));           /* U+10FFFF, the last */
	CHECK(valid("\xed\x9f\xbf"));               /* U+D7FF, just below the surrogates */
	CHECK(utf8_valid("a\0b", 3));               /* NUL is a character */
	CHECK(valid("ascii \xc3\xa9 ascii \xf0\x9f\x98\x80."));
}

TEST(utf8_valid_refuses_what_strict_decoders_refuse)
{
	CHECK(!valid("\x80"));             /* a lone continuation byte */
	CHECK(!valid("\xc3"));             /* cut short */
	CHECK(!valid("\xc3("));            /* no continuation */
	CHECK(!valid("\xc0\xaf"));         /* overlong '/' */
	CHECK(!valid("\xc1\xbf"));         /* overlong */
	CHECK(!valid("\xe0\x80\xaf"));     /* overlong, 3 bytes */
	CHECK(!valid("\xf0\x80\x80\xaf")); /* overlong, 4 bytes */
	CHECK(!valid("\xed\xa0\x80"));     /* U+D800, a surrogate */
	CHECK(!valid("\xed\xbf\xbf"));     /* U+DFFF */
	CHECK(!valid("\xf4\x90\x80\x80")); /* U+110000 */
	CHECK(!valid("\xf5\x80\x80\x80"));
	CHECK(!valid("\xff"));
	CHECK(!valid("\xe2\x82"));         /* a 3-byte sequence cut at 2 */
	/* The same after ASCII, which utf8_valid steps over without decoding. */
	CHECK(!valid("plain\x80"));
	CHECK(!valid("plain\xc3"));
	CHECK(!valid("ab\xed\xa0\x80"));
	CHECK(!valid("ab\xc3\xa9" "cd\xff"));
}

TEST(utf8_escape_writes_invalid_bytes_as_hex_and_keeps_the_rest)
{
	char out[64];
	const char in[] = "a\xc3\xa9\xff\xed\xa0\x80z\xc3";
	size_t n = utf8_escape(in, sizeof in - 1, out);
	out[n] = '\0';
	CHECK_STR(out, "a\xc3\xa9\\xff\\xed\\xa0\\x80z\\xc3");
	CHECK(utf8_valid(out, n));
	n = utf8_escape("ok", 2, out);
	CHECK_EQ(n, 2);
}

TEST(mp_strings_are_always_utf8)
{
	struct mp_map m;
	struct mp_array a;
	msgpack_sbuffer sb;
	mp_map_init(&m);
	mp_put_str(&m, "bad", "x\xfe");
	mp_put_strn(&m, "cut", "\xe2\x82\xac\xe2\x82", 5); /* € then a cut one, as truncation makes */
	mp_array_init(&a);
	mp_array_str(&a, "\x80");
	mp_put_array(&m, "list", &a);
	msgpack_sbuffer_init(&sb);
	mp_map_finish(&m, &sb);
	struct msg msg;
	struct gpuq_error err;
	CHECK(msg_decode(&msg, sb.data, sb.size, &msg_request_limits, &err) == 0);
	char s[32];
	CHECK(msg_get_str(msg.root, "bad", s, sizeof s, &err) == 1);
	CHECK_STR(s, "x\\xfe");
	CHECK(msg_get_str(msg.root, "cut", s, sizeof s, &err) == 1);
	CHECK_STR(s, "\xe2\x82\xac\\xe2\\x82");
	const msgpack_object *list = msg_map_get(msg.root, "list");
	CHECK(list && list->via.array.size == 1 && list->via.array.ptr[0].via.str.size == 4);
	msg_free(&msg);
	msgpack_sbuffer_destroy(&sb);
}
