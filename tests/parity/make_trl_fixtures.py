#!/usr/bin/env python3
"""Builds the TRL parity fixtures under tests/data/trl/: the preference and reward losses
as Hugging Face TRL's own code computes them, on tiny models, for smelt's
tests/unit/test_trl_parity.c.

Models (fp32 on disk; TRL runs them in float64 here so the reference numbers carry no
float32 rounding of their own):
  policy     tests/data/parity/llama (reused, not copied)
  reference  tests/data/trl/llama-ref: the policy with every weight perturbed by
             N(0, 0.05^2), so the log-ratios are neither zero nor huge
  reward     tests/data/parity/llama-rm (reused)

pairs.json holds the preference pairs as token ids (prompt, chosen, rejected; each
response ends in eos = 2, as TRL appends it) and, per loss case, TRL's results for each
pair run as its own batch of one (so TRL's batch means are the per-pair numbers smelt's
pref_pair_loss returns):
  policy_chosen/rejected, ref_chosen/rejected  summed response logprobs (TRL's DPO forward)
  loss                                         TRL's loss of that one-pair batch
  d_chosen, d_rejected                         torch autograd dL/d(summed policy logprob)
The reward cases hold the chosen/rejected sequences, a margin and the coefficient, and
RewardTrainer.compute_loss's loss with the scores and their gradients.

How TRL is called (all TRL code, nothing re-derived):
  DPO family   a real DPOTrainer (policy + reference), DPOTrainer._compute_loss on the
               batch its own collator builds; the gradient is read off the per-token
               log_probs the fused LM head returns (retain_grad): TRL's logps are their
               sum over the completion mask, so every response token carries dL/dlogps.
  SimPO        CPOTrainer.cpo_loss (loss_type "simpo", cpo_alpha 0) and ORPO's
  ORPO         ORPOTrainer.odds_ratio_loss, both on the mean response logprobs as
               CPOTrainer/ORPOTrainer.get_batch_logps(average_log_prob=True) gives them.
               These methods read only a few attributes of the trainer, so they are
               called on a namespace holding the CPOConfig/ORPOConfig values.
  reward       a real RewardTrainer, RewardTrainer.compute_loss on its collator's batch.

cDPO (sigmoid with label_smoothing) is gone from TRL >= 0.29, so that one case comes from
TRL 0.28.0's DPOTrainer.dpo_loss in a child process (see CDPO below).

Regenerate with `python3 tests/parity/make_trl_fixtures.py --legacy-trl DIR` (needs trl,
torch, transformers, safetensors, datasets, tokenizers; DIR holds TRL 0.28.0, from
`pip install --no-deps --target DIR trl==0.28.0`; without the option the cDPO case is
left out); the outputs are committed so `make test` needs no Python.
"""
import json
import os
import subprocess
import sys
import tempfile
import types

import tokenizers
import torch
import transformers
import trl
from datasets import Dataset
from safetensors.torch import save_file
from trl import DPOConfig, DPOTrainer, RewardConfig, RewardTrainer
from trl.experimental.cpo import CPOConfig, CPOTrainer
from trl.experimental.orpo import ORPOConfig, ORPOTrainer

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
OUT = os.path.join(DATA, "trl")
POLICY = os.path.join(DATA, "parity", "llama")
REWARD = os.path.join(DATA, "parity", "llama-rm")
EOS = 2

# (prompt, chosen, rejected) lengths; the responses' last token is eos.
SHAPES = [(4, 3, 5), (3, 6, 2), (5, 4, 4), (2, 1, 3)]
# (name, smelt config, TRL DPOConfig arguments). TRL >= 0.29 "sigmoid" ignores
# label_smoothing, so cDPO comes from TRL 0.28 (CDPO below); RPO is "sigmoid" + "sft"
# weighted by alpha.
DPO_CASES = [
    ("sigmoid", dict(type="sigmoid", beta=0.1), dict(loss_type=["sigmoid"], beta=0.1)),
    ("sigmoid_beta05", dict(type="sigmoid", beta=0.5), dict(loss_type=["sigmoid"], beta=0.5)),
    ("rpo", dict(type="sigmoid", beta=0.1, rpo_alpha=0.7),
     dict(loss_type=["sigmoid", "sft"], loss_weights=[1.0, 0.7], beta=0.1)),
    ("ipo", dict(type="ipo", beta=0.1), dict(loss_type=["ipo"], beta=0.1)),
    ("hinge", dict(type="hinge", beta=0.1), dict(loss_type=["hinge"], beta=0.1)),
    ("robust", dict(type="robust", beta=0.1, label_smoothing=0.2),
     dict(loss_type=["robust"], beta=0.1, label_smoothing=0.2)),
    ("apo_zero", dict(type="apo_zero", beta=0.1), dict(loss_type=["apo_zero"], beta=0.1)),
]
SIMPO_CASES = [
    ("simpo", dict(type="simpo", beta=2.0, simpo_gamma=0.5), dict(beta=2.0, simpo_gamma=0.5)),
    ("simpo_smoothed", dict(type="simpo", beta=2.5, simpo_gamma=1.2, label_smoothing=0.1),
     dict(beta=2.5, simpo_gamma=1.2, label_smoothing=0.1)),
]
ORPO_CASES = [("orpo", dict(type="orpo", beta=0.1), dict(beta=0.1)),
              ("orpo_beta1", dict(type="orpo", beta=1.0), dict(beta=1.0))]
REWARD_CASES = [("plain", 0.0, None), ("margin", 0.8, None), ("margin_center", -0.5, 0.01)]


def tokenizer():
    """A word-level tokenizer over "<0>".."<95>", so TRL's text pipeline maps "<5> <17>"
    to ids [5, 17]; eos (and pad) is <2>, as in the llama fixture. The brackets keep a
    special token from matching inside another ("t2" would split "t29")."""
    vocab = {f"<{i}>": i for i in range(96)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<2>", pad_token="<2>",
                                                bos_token="<1>", unk_token="<0>")


def text(ids):
    return "".join(f" <{i}>" for i in ids)


def make_pairs():
    gen = torch.Generator().manual_seed(2024)
    draw = lambda n: torch.randint(3, 95, (n,), generator=gen).tolist()  # never bos/eos
    return [dict(prompt=draw(p), chosen=draw(c - 1) + [EOS], rejected=draw(r - 1) + [EOS])
            for p, c, r in SHAPES]


def make_reference():
    ref = transformers.AutoModelForCausalLM.from_pretrained(POLICY, dtype=torch.float32)
    torch.manual_seed(555)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    out = os.path.join(OUT, "llama-ref")
    ref.save_pretrained(out, safe_serialization=True)
    gen_cfg = os.path.join(out, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)  # smelt reads config.json + model.safetensors only
    return out


def load_lm(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config._attn_implementation = "eager"
    return model.double()


def dataset(pairs):
    return Dataset.from_list([dict(prompt=text(p["prompt"]).strip(), chosen=text(p["chosen"]),
                                   rejected=text(p["rejected"])) for p in pairs])


def retain_output(trainer, field):
    """Puts the trainer's model in training mode and keeps its output `field` of every
    forward, with its gradient retained: the tensor TRL's loss is a function of."""
    trainer.model.train()
    captured = {}

    def keep(module, inputs, output):
        getattr(output, field).retain_grad()
        captured[field] = getattr(output, field)

    trainer.model.register_forward_hook(keep)
    return captured


def dpo_case(tmp, tok, pairs, ref_dir, trl_args):
    policy, ref = load_lm(POLICY), load_lm(ref_dir)
    args = DPOConfig(output_dir=tmp, report_to="none", use_cpu=True, bf16=False,
                     per_device_train_batch_size=1, max_length=None, **trl_args)
    trainer = DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=dataset(pairs),
                         processing_class=tok)
    captured = retain_output(trainer, "log_probs")
    results = []
    for i, p in enumerate(pairs):
        row = trainer.train_dataset[i]
        assert (row["prompt_ids"], row["chosen_ids"], row["rejected_ids"]) == (p["prompt"], p["chosen"], p["rejected"]), row
        batch = trainer.data_collator([row])
        trainer.model.zero_grad()
        loss = trainer._compute_loss(trainer.model, batch, return_outputs=False)
        loss.backward()
        lp, grad = captured["log_probs"], captured["log_probs"].grad
        mask = batch["completion_mask"][:, 1:].bool()
        d = []
        for s in range(2):  # the completion tokens of a sequence share one coefficient
            g = grad[s][mask[s]]
            assert torch.allclose(g, g[0].expand_as(g), rtol=1e-9, atol=1e-15), g
            d.append(g[0].item())
        with torch.no_grad():
            ref_lp = trainer.ref_model(**{k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")},
                                       labels=batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100),
                                       fused_lm_head=True).log_probs
        results.append(dict(policy_chosen=lp[0][mask[0]].sum().item(), policy_rejected=lp[1][mask[1]].sum().item(),
                            ref_chosen=ref_lp[0][mask[0]].sum().item(), ref_rejected=ref_lp[1][mask[1]].sum().item(),
                            loss=loss.item(), d_chosen=d[0], d_rejected=d[1]))
    return results


def mean_logps(model, p):
    """TRL's CPO/ORPO mean response logprobs of one pair: get_batch_logps on the
    concatenated [chosen, rejected] batch with the prompt masked (-100), as their
    concatenated_forward does; returned with the summed logprobs as leaves for autograd."""
    seqs = [p["prompt"] + p["chosen"], p["prompt"] + p["rejected"]]
    width = max(len(s) for s in seqs)
    ids = torch.full((2, width), EOS, dtype=torch.long)
    labels = torch.full((2, width), -100, dtype=torch.long)
    attn = torch.zeros((2, width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        attn[i, :len(s)] = 1
        labels[i, len(p["prompt"]):len(s)] = torch.tensor(s[len(p["prompt"]):])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits
    means = CPOTrainer.get_batch_logps(logits, labels, average_log_prob=True)
    assert torch.equal(means, ORPOTrainer.get_batch_logps(logits, labels, average_log_prob=True))
    n = torch.tensor([len(p["chosen"]), len(p["rejected"])], dtype=torch.float64)
    sums = (means * n).detach().requires_grad_(True)
    return sums, n


def trainer_namespace(config, **extra):
    """The attributes CPOTrainer.cpo_loss / ORPOTrainer.odds_ratio_loss read, taken from
    the config object as the trainers' __init__ does."""
    return types.SimpleNamespace(beta=config.beta, label_smoothing=getattr(config, "label_smoothing", 0.0),
                                 accelerator=types.SimpleNamespace(device=torch.device("cpu")), **extra)


def simpo_case(pairs, trl_args):
    model = load_lm(POLICY)
    cfg = CPOConfig(output_dir=tempfile.gettempdir(), loss_type="simpo", cpo_alpha=0.0, report_to="none", use_cpu=True, bf16=False, **trl_args)
    ns = trainer_namespace(cfg, loss_type=cfg.loss_type, simpo_gamma=cfg.simpo_gamma, alpha=cfg.alpha)
    results = []
    for p in pairs:
        sums, n = mean_logps(model, p)
        means = sums / n
        losses, _, _ = CPOTrainer.cpo_loss(ns, means[:1], means[1:])
        loss = losses.mean()  # + cpo_alpha * nll, with cpo_alpha 0
        loss.backward()
        results.append(dict(policy_chosen=sums[0].item(), policy_rejected=sums[1].item(),
                            loss=loss.item(), d_chosen=sums.grad[0].item(), d_rejected=sums.grad[1].item()))
    return results


def orpo_case(pairs, trl_args):
    """TRL's ORPO loss is policy_nll_loss - odds_ratio_loss(...).mean(), where its NLL is
    the cross entropy over the whole chosen sequence, prompt included (concatenated_forward
    labels every attended token). smelt's NLL covers the response only, so the fixture
    holds TRL's odds-ratio part (loss_or = -losses.mean()) and its gradient; the test adds
    smelt's response NLL -pc/nc, whose gradient -1/nc is exact."""
    model = load_lm(POLICY)
    cfg = ORPOConfig(output_dir=tempfile.gettempdir(), report_to="none", use_cpu=True, bf16=False, **trl_args)
    ns = trainer_namespace(cfg)
    results = []
    for p in pairs:
        sums, n = mean_logps(model, p)
        means = sums / n
        losses, _, _, _, _ = ORPOTrainer.odds_ratio_loss(ns, means[:1], means[1:])
        loss_or = -losses.mean()
        loss_or.backward()
        results.append(dict(policy_chosen=sums[0].item(), policy_rejected=sums[1].item(),
                            loss_or=loss_or.item(), d_or_chosen=sums.grad[0].item(),
                            d_or_rejected=sums.grad[1].item()))
    return results


def reward_case(tmp, tok, rows, center):
    model = transformers.AutoModelForSequenceClassification.from_pretrained(REWARD, dtype=torch.float32)
    model.config._attn_implementation = "eager"
    model = model.double()
    args = RewardConfig(output_dir=tmp, report_to="none", use_cpu=True, bf16=False,
                        per_device_train_batch_size=1, center_rewards_coefficient=center, max_length=None)
    data = Dataset.from_list([dict(chosen=text(r["chosen"]).strip(), rejected=text(r["rejected"]).strip(),
                                   margin=r["margin"]) for r in rows])
    trainer = RewardTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    captured = retain_output(trainer, "logits")
    results = []
    for i, r in enumerate(rows):
        row = trainer.train_dataset[i]
        batch = trainer.data_collator([row])
        loss = trainer.compute_loss(trainer.model, batch)
        loss.backward()
        scores, grad = captured["logits"][:, 0], captured["logits"].grad[:, 0]
        # The margin as TRL used it: its collator makes a float32 tensor (0.8 -> 0.800000011920929).
        results.append(dict(chosen=row["chosen_ids"], rejected=row["rejected_ids"], margin=batch["margin"][0].item(),
                            score_chosen=scores[0].item(), score_rejected=scores[1].item(), loss=loss.item(),
                            d_chosen=grad[0].item(), d_rejected=grad[1].item()))
    return results


def reward_rows(margin):
    gen = torch.Generator().manual_seed(31)
    draw = lambda n: torch.randint(3, 95, (n,), generator=gen).tolist()
    return [dict(chosen=draw(c), rejected=draw(r), margin=margin) for c, r in [(7, 5), (4, 8), (6, 6)]]


# cDPO: TRL >= 0.29's "sigmoid" no longer reads label_smoothing, so the case comes from
# TRL 0.28.0's DPOTrainer.dpo_loss (a method on logprob tensors), run in a child process
# with that TRL first on sys.path, on the logprobs the current TRL's DPO forward gave.
CDPO = ("sigmoid_cdpo", dict(type="sigmoid", beta=0.1, label_smoothing=0.2),
        dict(loss_type="sigmoid", beta=0.1, label_smoothing=0.2))


def cdpo_worker(legacy_dir):
    """Child process: reads the pairs' logprobs as JSON on stdin, writes TRL 0.28's loss
    and autograd gradients as JSON on stdout."""
    sys.path.insert(0, legacy_dir)
    for name in [m for m in sys.modules if m == "trl" or m.startswith("trl.")]:
        del sys.modules[name]
    import trl.import_utils as legacy_utils
    # TRL 0.28 takes transformers 5's (available, version) tuple for true and imports weave.
    legacy_utils.is_weave_available = lambda: False
    import trl as legacy
    from trl import DPOConfig as LegacyConfig, DPOTrainer as LegacyTrainer
    _, _, trl_args = CDPO
    cfg = LegacyConfig(output_dir=tempfile.gettempdir(), report_to="none", use_cpu=True, bf16=False, **trl_args)
    ns = types.SimpleNamespace(beta=cfg.beta, label_smoothing=cfg.label_smoothing, loss_type=cfg.loss_type,
                               reference_free=cfg.reference_free, f_divergence_type=cfg.f_divergence_type,
                               f_divergence_params=getattr(cfg, "f_divergence_params", None), args=cfg,
                               accelerator=types.SimpleNamespace(device=torch.device("cpu")))
    out = []
    for p in json.load(sys.stdin):
        pol = torch.tensor([p["policy_chosen"], p["policy_rejected"]], dtype=torch.float64, requires_grad=True)
        ref = torch.tensor([p["ref_chosen"], p["ref_rejected"]], dtype=torch.float64)
        losses, _, _ = LegacyTrainer.dpo_loss(ns, pol[:1], pol[1:], ref[:1], ref[1:], loss_type="sigmoid")
        loss = losses.mean()
        loss.backward()
        out.append(dict(p, loss=loss.item(), d_chosen=pol.grad[0].item(), d_rejected=pol.grad[1].item()))
    json.dump(dict(version=legacy.__version__, pairs=out), sys.stdout)


def cdpo_case(legacy_dir, dpo_pairs):
    logps = [{k: r[k] for k in ("policy_chosen", "policy_rejected", "ref_chosen", "ref_rejected")} for r in dpo_pairs]
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--cdpo-worker", legacy_dir],
                           input=json.dumps(logps), capture_output=True, text=True, check=True)
    return json.loads(child.stdout)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--cdpo-worker":
        return cdpo_worker(sys.argv[2])
    legacy_dir = sys.argv[2] if len(sys.argv) == 3 and sys.argv[1] == "--legacy-trl" else None
    os.makedirs(OUT, exist_ok=True)
    ref_dir = make_reference()
    tok = tokenizer()
    pairs = make_pairs()
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, smelt_cfg, trl_args in DPO_CASES:
            cases.append(dict(name=name, trl="DPOTrainer._compute_loss", config=smelt_cfg, trl_args=trl_args,
                              pairs=dpo_case(tmp, tok, pairs, ref_dir, trl_args)))
        if legacy_dir:
            name, smelt_cfg, trl_args = CDPO
            legacy = cdpo_case(legacy_dir, cases[0]["pairs"])
            cases.append(dict(name=name, trl=f"DPOTrainer.dpo_loss (trl {legacy['version']})", config=smelt_cfg,
                              trl_args=trl_args, pairs=legacy["pairs"]))
        for name, smelt_cfg, trl_args in SIMPO_CASES:
            cases.append(dict(name=name, trl="CPOTrainer.cpo_loss", config=smelt_cfg, trl_args=trl_args,
                              pairs=simpo_case(pairs, trl_args)))
        for name, smelt_cfg, trl_args in ORPO_CASES:
            cases.append(dict(name=name, trl="ORPOTrainer.odds_ratio_loss", config=smelt_cfg, trl_args=trl_args,
                              pairs=orpo_case(pairs, trl_args)))
        reward = []
        for name, margin, center in REWARD_CASES:
            reward.append(dict(name=name, center_rewards_coefficient=center or 0.0,
                               pairs=reward_case(tmp, tok, reward_rows(margin), center)))
    versions = dict(trl=trl.__version__, torch=torch.__version__, transformers=transformers.__version__)
    if legacy_dir:
        versions["trl_cdpo"] = legacy["version"]
    with open(os.path.join(OUT, "pairs.json"), "w") as f:
        json.dump(dict(versions=versions, policy="tests/data/parity/llama", reference="tests/data/trl/llama-ref",
                       reward_model="tests/data/parity/llama-rm", eos=EOS, pairs=pairs, cases=cases,
                       reward_cases=reward), f, indent=1)
    print(f"trl {trl.__version__}: {len(cases)} preference cases, {len(reward)} reward cases -> {OUT}")


if __name__ == "__main__":
    main()
