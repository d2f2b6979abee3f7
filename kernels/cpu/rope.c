/* TEMPORARY scaffold: replaced by the real implementation. */
#include "kernels/cpu/cpu.h"

int cpu_rope(struct tensor *y, const struct tensor *x, const struct tensor *positions,
             float theta, struct smelt_error *err) {
    (void)y;
    (void)x;
    (void)positions;
    (void)theta;
    return error_set(err, SMELT_EUNSUPPORTED, "cpu_rope: scaffold");
}

int cpu_rope_backward(struct tensor *dx, const struct tensor *dy,
                      const struct tensor *positions, float theta, struct smelt_error *err) {
    (void)dx;
    (void)dy;
    (void)positions;
    (void)theta;
    return error_set(err, SMELT_EUNSUPPORTED, "cpu_rope_backward: scaffold");
}

