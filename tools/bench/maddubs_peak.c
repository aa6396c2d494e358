/* The AVX2 int8 product ceiling of one core: `vpmaddubsw` + `vpaddw` (32 products, the step of
 * cortiq's interleaved Q4_K chunk kernel) on 8 independent register chains, no loads, nothing
 * else. Whatever a kernel of that arithmetic does besides (loads, scales, decode, the float
 * epilogue) only lowers it, so this bounds what any prefill built on it can reach.
 *
 *   gcc -O2 -mavx2 tools/bench/maddubs_peak.c -o /tmp/maddubs_peak && /tmp/maddubs_peak
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    const long n = 400000000; /* steps of 32 products, 16 per loop iteration */
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t = now();
        long it = n / 16;
        /* 8 accumulators (ymm0-7), weights ymm8/ymm9, activations ymm10/ymm11, products in
         * ymm12-15 (renamed): written in asm so no compiler spill sits in the loop */
        __asm__ volatile(
            "vpxor %%ymm0,%%ymm0,%%ymm0\n vpxor %%ymm1,%%ymm1,%%ymm1\n"
            "vpxor %%ymm2,%%ymm2,%%ymm2\n vpxor %%ymm3,%%ymm3,%%ymm3\n"
            "vpxor %%ymm4,%%ymm4,%%ymm4\n vpxor %%ymm5,%%ymm5,%%ymm5\n"
            "vpxor %%ymm6,%%ymm6,%%ymm6\n vpxor %%ymm7,%%ymm7,%%ymm7\n"
            "1:\n"
#define STEP(acc, w, x, p) "vpmaddubsw %%ymm" #x ",%%ymm" #w ",%%ymm" #p "\n vpaddw %%ymm" #p ",%%ymm" #acc ",%%ymm" #acc "\n"
            STEP(0, 8, 10, 12) STEP(1, 9, 10, 13) STEP(2, 8, 11, 14) STEP(3, 9, 11, 15)
            STEP(4, 8, 10, 12) STEP(5, 9, 10, 13) STEP(6, 8, 11, 14) STEP(7, 9, 11, 15)
            STEP(0, 9, 11, 12) STEP(1, 8, 11, 13) STEP(2, 9, 10, 14) STEP(3, 8, 10, 15)
            STEP(4, 9, 11, 12) STEP(5, 8, 11, 13) STEP(6, 9, 10, 14) STEP(7, 8, 10, 15)
            "dec %0\n jnz 1b\n"
            : "+r"(it)
            :
            : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm12", "xmm13",
              "xmm14", "xmm15", "cc");
        double g = n * 32.0 / (now() - t) / 1e9;
        if (g > best) best = g;
    }
    printf("vpmaddubsw+vpaddw, registers only, one thread: %.1f G products/s (best of 5)\n", best);
    return 0;
}
