/* Which GEMM kernels OpenBLAS runs, and making sure they suit the CPU.
 *
 * OpenBLAS built with DYNAMIC_ARCH picks its kernel set once, in its load-time
 * constructor, from a table of CPU models; Debian's 0.3.21 does not know recent Intel
 * cores and falls back to its Prescott (SSE3) kernels there, 4-5x below what the CPU can
 * do. The only way to choose otherwise is OPENBLAS_CORETYPE in the environment before
 * the library loads, so a program that finds a fallback re-executes itself once with the
 * variable set from the CPU's feature flags. A value the user or the machine already set
 * is always respected (some machines set it because old builds compute wrong results on
 * their processors). */
#include "kernels/cpu/cpu.h"

#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

char *openblas_get_corename(void);

const char *backend_cpu_blas_kernels(void) {
    const char *name = openblas_get_corename();
    return name ? name : "unknown";
}

int backend_cpu_threads(void) { return omp_get_max_threads(); }

static bool name_in(const char *name, const char *const *list) {
    for (; *list; list++)
        if (strcasecmp(name, *list) == 0) return true;
    return false;
}

const char *cpu_blas_kernels_for(const struct cpu_features *f, const char *current) {
    static const char *const avx512_sets[] = {"SkylakeX", "Cooperlake", "SapphireRapids", NULL};
    static const char *const avx2_sets[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", NULL};
    if (f->avx512 && !name_in(current, avx512_sets)) return f->avx512_bf16 ? "Cooperlake" : "SkylakeX";
    if (f->avx2_fma && !f->avx512 && !name_in(current, avx2_sets)) return f->amd ? "Zen" : "Haswell";
    return NULL;
}

static struct cpu_features this_cpu(void) {
    struct cpu_features f = {0};
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
    f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    f.amd = __builtin_cpu_is("amd");
#endif
    return f;
}

static const char *kernels_to_select(void) {
    if (getenv("OPENBLAS_CORETYPE")) return NULL;
    struct cpu_features f = this_cpu();
    return cpu_blas_kernels_for(&f, backend_cpu_blas_kernels());
}

void backend_cpu_select_kernels(char **argv) {
    const char *want = kernels_to_select();
    if (!want || !argv || !argv[0]) return;
    if (setenv("OPENBLAS_CORETYPE", want, 1) != 0) return;
    execv("/proc/self/exe", argv);
    /* Still here: the program goes on with the library's choice, which is slow but
     * correct; say so once. */
    fprintf(stderr, "smelt: OpenBLAS chose its %s kernels on a CPU that wants %s, and re-executing with "
                    "OPENBLAS_CORETYPE=%s failed (%s); set it in the environment\n",
            backend_cpu_blas_kernels(), want, want, strerror(errno));
    unsetenv("OPENBLAS_CORETYPE");
}
