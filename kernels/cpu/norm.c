/* TEMPORARY scaffold: replaced by the real implementation. */
#include "kernels/cpu/cpu.h"

int cpu_rmsnorm(struct tensor *y, struct tensor *rstd, const struct tensor *x,
                const struct tensor *w, float eps, struct smelt_error *err) {
    (void)y;
    (void)rstd;
    (void)x;
    (void)w;
    (void)eps;
    return error_set(err, SMELT_EUNSUPPORTED, "cpu_rmsnorm: scaffold");
}

int cpu_rmsnorm_backward(struct tensor *dx, struct tensor *dw, const struct tensor *dy,
                         const struct tensor *x, const struct tensor *w,
                         const struct tensor *rstd, struct smelt_error *err) {
    (void)dx;
    (void)dw;
    (void)dy;
    (void)x;
    (void)w;
    (void)rstd;
    return error_set(err, SMELT_EUNSUPPORTED, "cpu_rmsnorm_backward: scaffold");
}

int cpu_layernorm(struct tensor *y, struct tensor *mean, struct tensor *rstd,
                  const struct tensor *x, const struct tensor *w, const struct tensor *b,
                  float eps, struct smelt_error *err) {
    (void)y;
    (void)mean;
    (void)rstd;
    (void)x;
    (void)w;
    (void)b;
    (void)eps;
    return error_set(err, SMELT_EUNSUPPORTED, "cpu_layernorm: scaffold");
}

int cpu_layernorm_backward(struct tensor *dx, struct tensor *dw, struct tensor *db,
                           const struct tensor *dy, const struct tensor *x,
                           const struct tensor *w, const struct tensor *mean,
                           const struct tensor *rstd, struct smelt_error *err) {
    (void)dx;
    (void)dw;
    (void)db;
    (void)dy;
    (void)x;
    (void)w;
    (void)mean;
    (void)rstd;
    return error_set(err, SMELT_EUNSUPPORTED, "cpu_layernorm_backward: scaffold");
}

