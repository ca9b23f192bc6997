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

/* CRC-64/NVME (S3's x-amz-checksum-crc64nvme: polynomial 0xAD93D23594C93659 bit-reflected, initial value and final
 * XOR all ones; check value of "123456789" 0xAE8B14860A799888), the checksum of a tier upload record
 * (mqstore.format.tier_upload, version 4). The same fold as above, for a 64-bit register: a lane of 128 bits whose
 * low 64 (the first 8 bytes: the higher powers) are H and high 64 are L stands for H x^64 + L; moved forward by D
 * bits it is H x^(64+D) + L x^D, and a carry-less product of two bit-reflected 64-bit values is their product times
 * x, so the constants are x^(D+63) and x^(D-1) mod P, bit-reflected (D = 512 for the four lanes, 128 for one). The
 * last lane is not reduced by Barrett: its 16 bytes go through the table from a zero register (the lane is
 * congruent to everything folded so far), then the tail. Without PCLMULQDQ, and for inputs under 64 bytes, the
 * table runs eight bytes a step (slice-by-8). mqstore.format.crc64 holds the Python reference, and
 * tests/property/test_codec_crc64.py holds both to the definition over random lengths, alignments and bytes. */
#define MQ_CRC64_POLY 0x9A6C9329AC4BC9B5ULL /* P, reflected */

static uint64_t mq_crc64_table[8][256];

/* Fill the tables (the module's import calls it, under the GIL, before any use). */
static inline void mq_crc64_init(void) {
    for (int i = 0; i < 256; i++) {
        uint64_t reg = (uint64_t)i;
        for (int bit = 0; bit < 8; bit++)
            reg = (reg & 1) ? (reg >> 1) ^ MQ_CRC64_POLY : reg >> 1;
        mq_crc64_table[0][i] = reg;
    }
    for (int i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++)
            mq_crc64_table[k][i] = (mq_crc64_table[k - 1][i] >> 8) ^ mq_crc64_table[0][mq_crc64_table[k - 1][i] & 0xff];
}

/* The raw register (no complements) after ``n`` bytes from ``reg``, by the tables. */
static inline uint64_t mq_crc64_tables(uint64_t reg, const uint8_t* p, size_t n) {
    while (n >= 8) {
        uint64_t word = 0;
        for (int i = 7; i >= 0; i--)
            word = (word << 8) | p[i]; /* little-endian on any CPU */
        reg ^= word;
        reg = mq_crc64_table[7][reg & 0xff] ^ mq_crc64_table[6][(reg >> 8) & 0xff] ^
              mq_crc64_table[5][(reg >> 16) & 0xff] ^ mq_crc64_table[4][(reg >> 24) & 0xff] ^
              mq_crc64_table[3][(reg >> 32) & 0xff] ^ mq_crc64_table[2][(reg >> 40) & 0xff] ^
              mq_crc64_table[1][(reg >> 48) & 0xff] ^ mq_crc64_table[0][reg >> 56];
        p += 8;
        n -= 8;
    }
    while (n > 0) {
        reg = mq_crc64_table[0][(reg ^ *p) & 0xff] ^ (reg >> 8);
        p++;
        n--;
    }
    return reg;
}

#ifdef MQ_CRC_FOLD
#define MQ_C64_K1 0x0c32cdb31e18a84aULL /* x^(512+63) mod P, reflected: the low half's, four lanes */
#define MQ_C64_K2 0x62242240ace5045aULL /* x^(512-1) */
#define MQ_C64_K3 0xeadc41fd2ba3d420ULL /* x^(128+63): one lane */
#define MQ_C64_K4 0x21e9761e252621acULL /* x^(128-1) */

/* The raw register after ``n`` bytes (n >= 64, a multiple of 16) from register ``reg``. */
static __attribute__((target("pclmul,sse4.1"))) uint64_t mq_crc64_fold(uint64_t reg, const uint8_t* p, size_t n) {
    __m128i x0 = _mm_loadu_si128((const __m128i*)p);
    __m128i x1 = _mm_loadu_si128((const __m128i*)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i*)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i*)(p + 48));
    __m128i k = _mm_set_epi64x((long long)MQ_C64_K2, (long long)MQ_C64_K1);
    x0 = _mm_xor_si128(x0, _mm_set_epi64x(0, (long long)reg));
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
    k = _mm_set_epi64x((long long)MQ_C64_K4, (long long)MQ_C64_K3);
    x0 = mq_fold16(x0, k, x1);
    x0 = mq_fold16(x0, k, x2);
    x0 = mq_fold16(x0, k, x3);
    while (n >= 16) {
        x0 = mq_fold16(x0, k, _mm_loadu_si128((const __m128i*)p));
        p += 16;
        n -= 16;
    }
    uint8_t lane[16];
    _mm_storeu_si128((__m128i*)lane, x0);
    return mq_crc64_tables(0, lane, 16);
}
#endif

/* CRC-64/NVME of ``n`` bytes continuing from ``crc`` (0 to start), as zlib's crc32 API: complemented in and out. */
static inline uint64_t mq_crc64nvme(uint64_t crc, const uint8_t* p, size_t n) {
    uint64_t reg = ~crc;
#ifdef MQ_CRC_FOLD
    if (n >= 64) {
        if (mq_crc_fold_usable < 0) {
            __builtin_cpu_init();
            mq_crc_fold_usable = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
        }
        if (mq_crc_fold_usable) {
            size_t folded = n & ~(size_t)15;
            reg = mq_crc64_fold(reg, p, folded);
            p += folded;
            n -= folded;
        }
    }
#endif
    return ~mq_crc64_tables(reg, p, n);
}

#endif
