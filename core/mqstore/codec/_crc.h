/* zlib's CRC-32 (crc32(crc, buf, len), the same values) folded with carry-less multiplication where the CPU has
 * it (x86-64 PCLMULQDQ), else zlib's own. The records' body CRC is most of the compiled encoder's time on a batch
 * of 1 KiB bodies: zlib 1.2's table loop runs at ~1.5 GB/s here, the fold at several times that.
 *
 * The fold (Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ", Intel 2009, for the
 * bit-reflected polynomial 0xEDB88320): four 128-bit lanes advance 64 bytes a step, each lane multiplied by
 * x^(512+32) and x^(512-32) mod P (reflected); then the lanes fold into one by the 128-bit constants, the rest of
 * the 16-byte blocks likewise, 128 bits fold to 64 then 32, and a Barrett reduction gives the 32-bit remainder.
 * The tail (under 16 bytes) and short inputs go to the sliced loop below. The state between the two is the raw CRC
 * register (zlib complements on entry and exit).
 *
 * Short inputs (a timer unit's 44 bytes, a fold's tail, a body under 64 bytes): zlib 1.2's loop takes one byte a
 * step for them (~80 ns for 44 bytes here); eight tables take eight bytes a step ("slicing-by-8", Kounavis and
 * Berry, Intel 2006: ~40 ns). The tables are zlib's table and its seven successors (table t gives the CRC of a
 * byte followed by t zero bytes), made once per module that includes this (pthread_once) from the polynomial.
 *
 * tests/property/test_codec_crc.py holds it to zlib.crc32 over random lengths, alignments and bytes. */
#ifndef MQSTORE_CODEC_CRC_H
#define MQSTORE_CODEC_CRC_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

static uint32_t mq_crc_tables[8][256];
static pthread_once_t mq_crc_tables_once = PTHREAD_ONCE_INIT;

static void mq_crc_make_tables(void) {
    for (uint32_t byte = 0; byte < 256; byte++) {
        uint32_t crc = byte;
        for (int bit = 0; bit < 8; bit++)
            crc = crc & 1 ? 0xEDB88320u ^ (crc >> 1) : crc >> 1;
        mq_crc_tables[0][byte] = crc;
    }
    for (int byte = 0; byte < 256; byte++)
        for (int t = 1; t < 8; t++) {
            uint32_t before = mq_crc_tables[t - 1][byte];
            mq_crc_tables[t][byte] = (before >> 8) ^ mq_crc_tables[0][before & 0xff];
        }
}

/* The raw register (not complemented) after p[0..n): eight bytes a step, then one. */
static inline uint32_t mq_crc_sliced(uint32_t reg, const uint8_t* p, size_t n) {
    const uint32_t (*t)[256] = (const uint32_t (*)[256])mq_crc_tables;
    pthread_once(&mq_crc_tables_once, mq_crc_make_tables);
    while (n >= 8) {
        uint32_t low = ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24) ^ reg;
        uint32_t high = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        reg = t[7][low & 0xff] ^ t[6][(low >> 8) & 0xff] ^ t[5][(low >> 16) & 0xff] ^ t[4][low >> 24]
            ^ t[3][high & 0xff] ^ t[2][(high >> 8) & 0xff] ^ t[1][(high >> 16) & 0xff] ^ t[0][high >> 24];
        p += 8;
        n -= 8;
    }
    while (n-- > 0)
        reg = t[0][(reg ^ *p++) & 0xff] ^ (reg >> 8);
    return reg;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MQ_CRC_FOLD 1

/* Each constant: x^k mod P, bit-reflected and shifted (the paper's k1..k5), with mu and P for Barrett. */
#define MQ_K1 0x154442bd4ULL /* x^(4*128+32) */
#define MQ_K2 0x1c6e41596ULL /* x^(4*128-32) */
#define MQ_K3 0x1751997d0ULL /* x^(128+32) */
#define MQ_K4 0x0ccaa009eULL /* x^(128-32) */
#define MQ_K5 0x163cd6124ULL /* x^64 */
#define MQ_P 0x1db710641ULL  /* P, reflected */
#define MQ_MU 0x1f7011641ULL /* floor(x^64 / P), reflected */

static inline __attribute__((target("pclmul,sse4.1"))) __m128i mq_fold16(__m128i lane, __m128i k, __m128i next) {
    __m128i lo = _mm_clmulepi64_si128(lane, k, 0x00);
    __m128i hi = _mm_clmulepi64_si128(lane, k, 0x11);
    return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

/* The raw register after ``n`` bytes (n >= 64, a multiple of 16) from register ``reg``. */
static __attribute__((target("pclmul,sse4.1"))) uint32_t mq_crc_fold(uint32_t reg, const uint8_t* p, size_t n) {
    __m128i x0 = _mm_loadu_si128((const __m128i*)p);
    __m128i x1 = _mm_loadu_si128((const __m128i*)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i*)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i*)(p + 48));
    __m128i k = _mm_set_epi64x((long long)MQ_K2, (long long)MQ_K1);
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)reg));
    p += 64;
    n -= 64;
    while (n >= 64) {
        x0 = mq_fold16(x0, k, _mm_loadu_si128((const __m128i*)p));
        x1 = mq_fold16(x1, k, _mm_loadu_si128((const __m128i*)(p + 16)));
        x2 = mq_fold16(x2, k, _mm_loadu_si128((const __m128i*)(p + 32)));
        x3 = mq_fold16(x3, k, _mm_loadu_si128((const __m128i*)(p + 48)));
        p += 64;
        n -= 64;
    }
    k = _mm_set_epi64x((long long)MQ_K4, (long long)MQ_K3);
    x0 = mq_fold16(x0, k, x1);
    x0 = mq_fold16(x0, k, x2);
    x0 = mq_fold16(x0, k, x3);
    while (n >= 16) {
        x0 = mq_fold16(x0, k, _mm_loadu_si128((const __m128i*)p));
        p += 16;
        n -= 16;
    }
    /* 128 -> 64 bits: the low half times x^(128-32) into the high half (32 zero bits appended). */
    __m128i t = _mm_clmulepi64_si128(k, x0, 0x01);
    x0 = _mm_xor_si128(_mm_srli_si128(x0, 8), t);
    /* 64 -> 32 bits */
    __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i k5 = _mm_set_epi64x(0, (long long)MQ_K5);
    t = _mm_clmulepi64_si128(_mm_and_si128(x0, mask32), k5, 0x00);
    x0 = _mm_xor_si128(_mm_srli_si128(x0, 4), t);
    /* Barrett reduction */
    __m128i pmu = _mm_set_epi64x((long long)MQ_MU, (long long)MQ_P);
    t = _mm_clmulepi64_si128(_mm_and_si128(x0, mask32), pmu, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), pmu, 0x00);
    x0 = _mm_xor_si128(x0, t);
    return (uint32_t)_mm_extract_epi32(x0, 1);
}

static int mq_crc_fold_usable = -1; /* -1: not asked yet (a race only asks twice) */
#endif

/* zlib's crc32(crc, p, n) for any n (zlib takes 32-bit lengths: longer inputs go in pieces). */
static inline uint32_t mq_crc32(uint32_t crc, const uint8_t* p, size_t n) {
#ifdef MQ_CRC_FOLD
    if (n >= 64) {
        if (mq_crc_fold_usable < 0) {
            __builtin_cpu_init();
            mq_crc_fold_usable = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
        }
        if (mq_crc_fold_usable) {
            size_t folded = n & ~(size_t)15;
            crc = ~mq_crc_fold(~crc, p, folded);
            p += folded;
            n -= folded;
        }
    }
#endif
    if (n < 64)  /* short, or the fold's tail */
        return ~mq_crc_sliced(~crc, p, n);
    while (n > 0) {
        unsigned int chunk = n > (1u << 30) ? (1u << 30) : (unsigned int)n;
        crc = (uint32_t)crc32(crc, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return crc;
}

#endif
