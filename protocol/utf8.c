/* UTF-8 validation and escaping (see utf8.h). Any thread; no state. */
#include "protocol/utf8.h"

size_t utf8_sequence(const unsigned char *s, size_t n)
{
	unsigned char b = s[0];
	if (b < 0x80)
		return 1;
	size_t len;
	unsigned char lo = 0x80, hi = 0xBF; /* the range of the second byte */
	if (b >= 0xC2 && b <= 0xDF) {
		len = 2;
	} else if (b >= 0xE0 && b <= 0xEF) {
		len = 3;
		if (b == 0xE0)
			lo = 0xA0; /* overlong below U+0800 */
		else if (b == 0xED)
			hi = 0x9F; /* surrogates */
	} else if (b >= 0xF0 && b <= 0xF4) {
		len = 4;
		if (b == 0xF0)
			lo = 0x90; /* overlong below U+10000 */
		else if (b == 0xF4)
			hi = 0x8F; /* above U+10FFFF */
	} else {
		return 0; /* a continuation byte, C0/C1 (overlong) or F5..FF */
	}
	if (n < len || s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if (s[i] < 0x80 || s[i] > 0xBF)
			return 0;
	return len;
}

bool utf8_valid(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	for (size_t i = 0; i < n;) {
		if (p[i] < 0x80) { /* ASCII, nearly every string a request or reply holds */
			i++;
			continue;
		}
		size_t len = utf8_sequence(p + i, n - i);
		if (len == 0)
			return false;
		i += len;
	}
	return true;
}

size_t utf8_escape(const char *s, size_t n, char *out)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *p = (const unsigned char *)s;
	size_t o = 0;
	for (size_t i = 0; i < n;) {
		size_t len = utf8_sequence(p + i, n - i);
		if (len == 0) {
			out[o++] = '\\';
			out[o++] = 'x';
			out[o++] = hex[p[i] >> 4];
			out[o++] = hex[p[i] & 15];
			i++;
			continue;
		}
		for (size_t k = 0; k < len; k++)
			out[o++] = (char)p[i++];
	}
	return o;
}
