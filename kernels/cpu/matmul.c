/* TEMPORARY scaffold: replaced by the real implementation. */
#include "kernels/cpu/cpu.h"

int cpu_matmul(struct tensor *out, const struct tensor *a, const struct tensor *b,
               const struct tensor *bias, bool trans_a, bool trans_b, float alpha, float beta,
               struct smelt_error *err) {
    (void)out;
    (void)a;
    (void)b;
    (void)bias;
    (void)trans_a;
    (void)trans_b;
    (void)alpha;
    (void)beta;
    return error_set(err, SMELT_EUNSUPPORTED, "cpu_matmul: scaffold");
}

int cpu_matmul_backward(struct tensor *da, struct tensor *db, struct tensor *dbias,
                        const struct tensor *dout, const struct tensor *a, const struct tensor *b,
                        bool trans_a, bool trans_b, float alpha, struct smelt_error *err) {
    (void)da;
    (void)db;
    (void)dbias;
    (void)dout;
    (void)a;
    (void)b;
    (void)trans_a;
    (void)trans_b;
    (void)alpha;
    return error_set(err, SMELT_EUNSUPPORTED, "cpu_matmul_backward: scaffold");
}

