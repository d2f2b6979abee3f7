"""Helpers shared by the parity scripts of this folder: the weight widening every
fixture builder applies to its random model, and the one-line verdict the check_*
scripts end with."""
import sys

import torch


def widen_weights(model):
    """Random init is small for tiny models; widen it so every path matters numerically.
    Norm weights go near 1 (and norm biases near 0) so the activations stay in range."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p)) if name.endswith("weight") else p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))


def finish(results, versions):
    """Prints the verdict over (ok, worst difference) results with the library versions
    that produced the reference, and exits 1 on any mismatch."""
    failed = not all(ok for ok, _ in results)
    worst = max(w for _, w in results)
    print(f"{versions}: {'all match' if not failed else 'MISMATCH'} (worst {worst:.2e})")
    sys.exit(1 if failed else 0)
