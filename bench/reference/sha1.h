/* SHA-1 and base64, only for the WebSocket handshake's Sec-WebSocket-Accept (RFC 6455 §4.2.2).
 * Written out here so the reference server builds with nothing but a C compiler. */
#ifndef REFERENCE_SHA1_H
#define REFERENCE_SHA1_H
#include <stdint.h>
#include <string.h>

static uint32_t sha1_rol(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

static void sha1(const unsigned char *msg, size_t len, unsigned char out[20]) {
    uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
    size_t total = ((len + 8) / 64 + 1) * 64;
    unsigned char block[64];
    for (size_t off = 0; off < total; off += 64) {
        for (size_t i = 0; i < 64; i++) {
            size_t p = off + i;
            block[i] = p < len ? msg[p] : p == len ? 0x80 : 0;
        }
        if (off + 64 == total)
            for (int i = 0; i < 8; i++) block[56 + i] = (uint64_t)len * 8 >> (56 - 8 * i);
        uint32_t w[80];
        for (int i = 0; i < 16; i++)
            w[i] = (uint32_t)block[4 * i] << 24 | block[4 * i + 1] << 16 | block[4 * i + 2] << 8 | block[4 * i + 3];
        for (int i = 16; i < 80; i++) w[i] = sha1_rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
        for (int i = 0; i < 80; i++) {
            uint32_t f, k;
            if (i < 20) { f = (b & c) | (~b & d); k = 0x5A827999; }
            else if (i < 40) { f = b ^ c ^ d; k = 0x6ED9EBA1; }
            else if (i < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8F1BBCDC; }
            else { f = b ^ c ^ d; k = 0xCA62C1D6; }
            uint32_t t = sha1_rol(a, 5) + f + e + k + w[i];
            e = d; d = c; c = sha1_rol(b, 30); b = a; a = t;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e;
    }
    for (int i = 0; i < 20; i++) out[i] = h[i / 4] >> (24 - 8 * (i % 4));
}

/* out: 28 characters of base64 and a NUL. */
static void websocket_accept(const char *key, size_t n, char out[29]) {
    static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    unsigned char in[128], d[21];
    if (n > sizeof in - sizeof guid) n = sizeof in - sizeof guid;
    memcpy(in, key, n);
    memcpy(in + n, guid, sizeof guid - 1);
    sha1(in, n + sizeof guid - 1, d);
    d[20] = 0;
    for (int i = 0, o = 0; i < 21; i += 3, o += 4) {
        uint32_t v = d[i] << 16 | (i + 1 < 21 ? d[i + 1] << 8 : 0) | (i + 2 < 21 ? d[i + 2] : 0);
        out[o] = b64[v >> 18 & 63];
        out[o + 1] = b64[v >> 12 & 63];
        out[o + 2] = b64[v >> 6 & 63];
        out[o + 3] = b64[v & 63];
    }
    out[27] = '=';
    out[28] = 0;
}
#endif
