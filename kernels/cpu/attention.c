/* TEMPORARY scaffold: replaced by the real implementation. */
#include "kernels/cpu/cpu.h"

int cpu_attention(struct tensor *out, struct tensor *lse, const struct tensor *q,
                  const struct tensor *k, const struct tensor *v,
                  const struct tensor *cu_seqlens, float scale, struct smelt_error *err) {
    (void)out;
    (void)lse;
    (void)q;
    (void)k;
    (void)v;
    (void)cu_seqlens;
    (void)scale;
    return error_set(err, SMELT_EUNSUPPORTED, "cpu_attention: scaffold");
}

int cpu_attention_backward(struct tensor *dq, struct tensor *dk, struct tensor *dv,
                           const struct tensor *dout, const struct tensor *q,
                           const struct tensor *k, const struct tensor *v,
                           const struct tensor *out, const struct tensor *lse,
                           const struct tensor *cu_seqlens, float scale,
                           struct smelt_error *err) {
    (void)dq;
    (void)dk;
    (void)dv;
    (void)dout;
    (void)q;
    (void)k;
    (void)v;
    (void)out;
    (void)lse;
    (void)cu_seqlens;
    (void)scale;
    return error_set(err, SMELT_EUNSUPPORTED, "cpu_attention_backward: scaffold");
}

