/* kernels/cpu/blas.c: which OpenBLAS kernel set a CPU gets, and what the library runs. */
#include "tests/unit/testutil.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

static const struct cpu_features AVX512_BF16 = {.avx512 = true, .avx512_bf16 = true, .avx2_fma = true},
                                 AVX512 = {.avx512 = true, .avx2_fma = true},
                                 INTEL_AVX2 = {.avx2_fma = true},
                                 AMD_AVX2 = {.avx2_fma = true, .amd = true},
                                 OLD = {0};

static void expect_kernels(const struct cpu_features *f, const char *current, const char *want) {
    const char *got = cpu_blas_kernels_for(f, current);
    if (!want) cr_expect_null(got, "%s: re-selected as %s", current, got ? got : "");
    else cr_expect(got && strcmp(got, want) == 0, "%s: got %s, want %s", current, got ? got : "(keep)", want);
}

/* Debian's 0.3.21 falls back to Prescott on Intel cores it does not know (an AVX-512
 * Xeon ran at a fifth of its GEMM rate): those are re-selected by feature, and what
 * already suits the CPU is kept. */
Test(cpu_blas, kernels_follow_the_cpu_features) {
    expect_kernels(&AVX512_BF16, "Prescott", "Cooperlake");
    expect_kernels(&AVX512, "Prescott", "SkylakeX");
    expect_kernels(&AVX512, "Haswell", "SkylakeX");
    expect_kernels(&AVX512, "SkylakeX", NULL);
    expect_kernels(&AVX512_BF16, "SapphireRapids", NULL);
    expect_kernels(&INTEL_AVX2, "Prescott", "Haswell");
    expect_kernels(&INTEL_AVX2, "Sandybridge", "Haswell");
    expect_kernels(&AMD_AVX2, "Prescott", "Zen");
    expect_kernels(&AMD_AVX2, "Zen", NULL);
    expect_kernels(&AMD_AVX2, "Haswell", NULL);
    expect_kernels(&OLD, "Prescott", NULL); /* nothing better to ask for */
}

/* The library reports a kernel set, and the CPU backend one OpenMP pool of threads. */
Test(cpu_blas, reports_what_runs) {
    const char *k = backend_cpu_blas_kernels();
    cr_assert(k && k[0] && strcmp(k, "unknown") != 0);
    cr_expect(backend_cpu_threads() >= 1);
}
