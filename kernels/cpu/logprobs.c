/* TEMPORARY scaffold: replaced by the real implementation. */
#include "kernels/cpu/cpu.h"

int cpu_logprobs(struct tensor *logprobs, struct tensor *lse, const struct tensor *logits,
                 const struct tensor *targets, struct smelt_error *err) {
    (void)logprobs;
    (void)lse;
    (void)logits;
    (void)targets;
    return error_set(err, SMELT_EUNSUPPORTED, "cpu_logprobs: scaffold");
}

int cpu_logprobs_backward(struct tensor *dlogits, const struct tensor *dlogprobs,
                          const struct tensor *logits, const struct tensor *targets,
                          const struct tensor *lse, struct smelt_error *err) {
    (void)dlogits;
    (void)dlogprobs;
    (void)logits;
    (void)targets;
    (void)lse;
    return error_set(err, SMELT_EUNSUPPORTED, "cpu_logprobs_backward: scaffold");
}

