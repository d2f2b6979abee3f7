#!/usr/bin/env python3
"""The PyTorch side of the GPU benchmarks: the same work as bench/gpu's C programs, done
with transformers / PEFT / torch on the same device, as JSON lines with the same fields.

    python3 bench/gpu/peers.py env
    python3 bench/gpu/peers.py sft  --model 0.5b,1.5b --mode full,lora [--peak-tflops P]
    python3 bench/gpu/peers.py gen  --model 0.5b --batch 1,32,256
    python3 bench/gpu/peers.py attn [--dtype f32,bf16] [--lens 1024,2048,4096] [--shapes 16x16x128,...]
    python3 bench/gpu/peers.py copy [--mb 1024]
    python3 bench/gpu/peers.py sft --device cpu --tiny        # any command, tiny sizes on the CPU

sft   transformers Qwen2ForCausalLM from a Qwen2Config of sft_gpu's shapes, random init,
      bf16 parameters, attn_implementation="sdpa"; a batch of tokens / seq_len rows of
      seq_len random ids (labels = ids: the model's shifted loss trains seq_len - 1 tokens
      a row, as sft_gpu's packed sequences do); a step is forward, backward, global-norm
      clipping at 1.0, AdamW (fused on CUDA; lr 1e-5, no weight decay), zero_grad. Full:
      every parameter trains, optimizer state in bf16 like the parameters. LoRA: PEFT,
      r=16, alpha=32, dropout 0, the seven linears of every layer; PEFT keeps the adapter
      in f32 (its default autocast_adapter_dtype).
gen   model.generate on B prompts of prompt_len random ids (no padding, attention mask of
      ones), greedy, min_new_tokens = max_new_tokens, eos cleared from the generation
      config (as bench/rollout_cpu.py does, so no token is banned and every row generates
      exactly new_tokens). One untimed warm-up call of 8 new tokens. A logits processor
      stamps the clock after a device sync at every generated token: the gaps between
      stamps are the decode steps (median reported), the time to the first stamp is the
      prefill.
attn  torch.nn.functional.scaled_dot_product_attention(is_causal=True, enable_gqa when
      Hkv < Hq) on [seqs, H, seq_len, D], random inputs in [-1, 1); forward with grad
      enabled (it keeps what the backward needs, as ops_attention keeps lse), backward
      with retain_graph, each timed like attention_gpu (one untimed call, 3..50 timed).
copy  dst.copy_(src) of an --mb buffer of random floats, bytes read + written / time,
      median of 7 after one warm-up.

Every timed interval starts and ends with torch.cuda.synchronize() on CUDA. A config that
fails (out of memory, say) gives a row with status "error" and the others still run; a
missing CUDA device gives rows with status "unsupported". Exit status: 0 when every row is
ok, 3 when some are unsupported, 1 when some failed.
"""
import argparse
import gc
import json
import math
import statistics
import sys
import time

import torch

# bench/gpu/bench_gpu.h's bench_models: Qwen2.5-0.5B, Qwen2.5-1.5B, and a tiny Qwen2.
MODELS = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936, max_position_embeddings=32768),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=176, vocab_size=1024, max_position_embeddings=4096),
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA_RANK, LORA_ALPHA = 16, 32
LR, MAX_GRAD_NORM = 1e-5, 1.0
WARMUP_NEW_TOKENS = 8
COPY_REPEATS = 7
ATTN_MIN_RUNS, ATTN_MAX_RUNS, ATTN_TARGET_S = 3, 50, 0.25
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

worst = 0  # exit status: 0 ok, 3 unsupported, 1 error


class Unsupported(Exception):
    """The device asked for is not there."""


def emit(row):
    print(json.dumps(row), flush=True)


def finish(row, fn):
    """Runs fn(row) to fill in the results; sets status (and error) and prints the row."""
    global worst
    try:
        fn(row)
        row["status"] = "ok"
    except Unsupported as e:
        row.update(status="unsupported", error=str(e))
        worst = worst or 3
    except Exception as e:  # a failed config is a row, never the end of the run
        row.update(status="error", error=f"{type(e).__name__}: {e}"[:500])
        worst = 1
        print(f"peers: {row.get('bench')}: {row['error']}", file=sys.stderr)
    emit(row)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def device_of(name):
    if name == "cuda" and not torch.cuda.is_available():
        raise Unsupported("no CUDA device (torch.cuda.is_available() is False)")
    return torch.device(name)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device):
    sync(device)
    return time.perf_counter()


def listed(text, conv=str):
    return [conv(x) for x in text.split(",") if x]


# ---- models and FLOPs (bench_gpu.h's formulas) ----

def qwen2_config(name):
    import transformers
    return transformers.Qwen2Config(**MODELS[name], rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
                                    use_sliding_window=False, hidden_act="silu")


def build_model(name, device, dtype, seed):
    import transformers
    torch.manual_seed(seed)
    with device:
        model = transformers.AutoModelForCausalLM.from_config(qwen2_config(name), dtype=dtype,
                                                              attn_implementation="sdpa")
    return model.to(device)


def head_dim(m):
    return m["hidden_size"] // m["num_attention_heads"]


def matmul_params(m):
    c, f, d = m["hidden_size"], m["intermediate_size"], head_dim(m)
    qd, kd = m["num_attention_heads"] * d, m["num_key_value_heads"] * d
    return m["num_hidden_layers"] * (c * qd + 2 * c * kd + qd * c + 3 * c * f) + m["vocab_size"] * c


def attention_forward_flops(layers, heads, d, seqs, seq_len):
    return layers * 4.0 * heads * d * seqs * seq_len * seq_len / 2.0


def sft_flops(m, lora, adapter_params, tokens, seq_len):
    n, t = float(matmul_params(m)), float(tokens)
    attn = 3.0 * attention_forward_flops(m["num_hidden_layers"], m["num_attention_heads"], head_dim(m),
                                         tokens // seq_len, seq_len)
    return 4.0 * n * t + 6.0 * adapter_params * t + attn if lora else 6.0 * n * t + attn


# ---- commands ----

def cmd_env(args):
    import transformers
    row = {"bench": "env", "impl": "torch", "torch": torch.__version__, "transformers": transformers.__version__,
           "python": sys.version.split()[0], "cuda_available": torch.cuda.is_available()}
    try:
        import peft
        row["peft"] = peft.__version__
    except ImportError as e:
        row["peft"] = f"missing: {e}"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        row.update(device_name=p.name, device_memory_gib=round(p.total_memory / 2**30, 1),
                   sms=p.multi_processor_count, cuda=torch.version.cuda)
    row["status"] = "ok"
    emit(row)


def sft_one(args, name, mode, row):
    device = device_of(args.device)
    m = MODELS[name]
    tokens = args.tokens or {"tiny": 256, "1.5b": 4096}.get(name, 8192)
    seq_len = args.seq_len or (64 if name == "tiny" else 1024)
    if tokens % seq_len:
        raise ValueError(f"--tokens {tokens} is not a multiple of --seq-len {seq_len}")
    row.update(tokens=tokens, seq_len=seq_len)
    model = build_model(name, device, DTYPES[args.dtype], args.seed)
    params = sum(p.numel() for p in model.parameters())
    adapter = 0
    if mode == "lora":
        import peft
        model = peft.get_peft_model(model, peft.LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                                                           target_modules=LORA_TARGETS, bias="none",
                                                           task_type="CAUSAL_LM"))
        row.update(lora_rank=LORA_RANK, lora_alpha=float(LORA_ALPHA))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    if mode == "lora":
        adapter = n_trainable
        row["adapter_dtype"] = str(trainable[0].dtype).replace("torch.", "")
    opt = torch.optim.AdamW(trainable, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, m["vocab_size"], (tokens // seq_len, seq_len), generator=gen).to(device)

    def step():
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(trainable, MAX_GRAD_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss, norm

    times, losses = [], []
    for k in range(args.warmup + args.steps):
        t0 = now(device)
        loss, norm = step()
        t1 = now(device)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            raise RuntimeError(f"step {k + 1}: the loss is {losses[-1]}")
        if k >= args.warmup:
            times.append(t1 - t0)
    step_s = statistics.median(times)
    flops = sft_flops(m, mode == "lora", adapter, tokens, seq_len)
    achieved = flops / step_s / 1e12
    peak = args.peak_tflops or None
    row.update(params=params, matmul_params=float(matmul_params(m)), trainable_params=n_trainable,
               step_ms=1e3 * step_s, step_ms_min=1e3 * min(times), step_ms_max=1e3 * max(times),
               tokens_per_s=tokens / step_s, flops_per_step=flops, tflops=achieved, peak_tflops=peak,
               mfu=achieved / peak if peak else None, loss_first=losses[0], loss_last=losses[-1],
               grad_norm_last=float(norm))
    del model, opt, ids


def cmd_sft(args):
    for name in listed(args.model):
        for mode in listed(args.mode):
            row = {"bench": "sft", "impl": "torch", "peer": "transformers+peft" if mode == "lora" else "transformers",
                   "model": name, "mode": mode, "backend": args.device, "dtype": args.dtype,
                   "steps": args.steps, "warmup": args.warmup}
            finish(row, lambda r, n=name, md=mode: sft_one(args, n, md, r))


class StepClock:
    """A logits processor that stamps the clock, the device idle, at every generated token."""

    def __init__(self, device):
        self.device, self.stamps = device, []

    def __call__(self, input_ids, scores):
        self.stamps.append(now(self.device))
        return scores


def generate(model, ids, new_tokens, processors=None):
    import transformers
    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                           pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                             logits_processor=processors)
    if out.shape[1] - ids.shape[1] != new_tokens:
        raise RuntimeError(f"generate made {out.shape[1] - ids.shape[1]} tokens, not {new_tokens}")
    return out


def gen_one(args, model, batch, copy_gbps, row):
    import transformers
    device = device_of(args.device)
    m = MODELS[args.model]
    gen = torch.Generator().manual_seed(args.seed + batch)
    ids = torch.randint(0, m["vocab_size"], (batch, args.prompt_len), generator=gen).to(device)
    generate(model, ids, WARMUP_NEW_TOKENS)
    clock = StepClock(device)
    t0 = now(device)
    generate(model, ids, args.new_tokens, transformers.LogitsProcessorList([clock]))
    t1 = now(device)
    gaps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
    step_s = statistics.median(gaps)
    elem = DTYPES[args.dtype].itemsize
    params = sum(p.numel() for p in model.parameters())
    kv_tok = 2 * m["num_hidden_layers"] * m["num_key_value_heads"] * head_dim(m) * elem
    mean_ctx = args.prompt_len + args.new_tokens / 2
    step_bytes = params * elem + batch * mean_ctx * kv_tok
    gbps = step_bytes / step_s / 1e9
    row.update(params=params, generated_tokens=batch * args.new_tokens, wall_s=t1 - t0,
               tokens_per_s=batch * args.new_tokens / (t1 - t0), prefill_ms=1e3 * (clock.stamps[0] - t0),
               decode_steps=len(gaps), decode_step_ms=1e3 * step_s, decode_tokens_per_s=batch / step_s,
               weight_bytes=float(params * elem), kv_bytes_per_token=kv_tok, mean_context=mean_ctx,
               decode_bytes_per_step=float(step_bytes), decode_gbps=gbps, copy_gbps=copy_gbps,
               bw_fraction=gbps / copy_gbps if copy_gbps else None)


def cmd_gen(args):
    copy_row = {"bench": "copy", "impl": "torch", "backend": args.device, "mb": args.copy_mb}
    finish(copy_row, lambda r: copy_one(args, r))
    model, load_error = None, None
    try:
        model = build_model(args.model, device_of(args.device), DTYPES[args.dtype], args.seed).eval()
        # generate fills unset fields of the GenerationConfig it is given from this one: eos
        # must go here too, or min_new_tokens would still ban it (bench/rollout_cpu.py).
        model.generation_config.eos_token_id = None
    except Exception as e:  # reported in every batch's row
        load_error = e
    for batch in listed(args.batch, int):
        row = {"bench": "gen", "impl": "torch", "peer": "transformers", "model": args.model, "backend": args.device,
               "dtype": args.dtype, "batch": batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens}

        def fill(r, b=batch):
            if load_error:
                raise load_error
            gen_one(args, model, b, copy_row.get("gbps"), r)
        finish(row, fill)


def copy_one(args, row):
    device = device_of(args.device)
    n = args.copy_mb * 2**20 // 4
    a = torch.rand(n, device=device) - 0.5
    b = torch.empty_like(a)
    b.copy_(a)
    times = []
    for k in range(COPY_REPEATS):
        src, dst = (b, a) if k % 2 else (a, b)
        t0 = now(device)
        dst.copy_(src)
        times.append(now(device) - t0)
    s = statistics.median(times)
    row.update(bytes=2.0 * n * 4, repeats=COPY_REPEATS, ms=1e3 * s, gbps=2.0 * n * 4 / s / 1e9)
    del a, b


def cmd_copy(args):
    row = {"bench": "copy", "impl": "torch", "backend": args.device, "mb": args.copy_mb}
    finish(row, lambda r: copy_one(args, r))


def time_call(fn, device):
    t0 = now(device)
    fn()
    first = now(device) - t0
    n = min(ATTN_MAX_RUNS, max(ATTN_MIN_RUNS, int(ATTN_TARGET_S / max(first, 1e-9))))
    times = []
    for _ in range(n):
        t0 = now(device)
        fn()
        times.append(now(device) - t0)
    return statistics.median(times), n


def attn_one(args, dtype, seq_len, shape, row):
    import torch.nn.functional as F
    device = device_of(args.device)
    hq, hkv, d = shape
    dt = DTYPES[dtype]
    gen = torch.Generator(device=device).manual_seed(seq_len * 131 + hq * 17 + hkv * 5 + d)

    def rand(h):  # drawn on the device: the host would take seconds for the largest rows
        return (torch.rand(args.seqs, h, seq_len, d, generator=gen, device=device) * 2 - 1).to(dt)

    q, k, v = rand(hq).requires_grad_(), rand(hkv).requires_grad_(), rand(hkv).requires_grad_()
    dout = rand(hq)
    gqa = hkv != hq
    out = {}

    def forward():
        out["o"] = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    def backward():
        out["o"].backward(dout, retain_graph=True)

    fwd_flops = 4.0 * d * hq * args.seqs * seq_len * seq_len / 2.0
    row["fwd_flops"] = fwd_flops
    fwd_s, fwd_runs = time_call(forward, device)
    row.update(fwd_ms=1e3 * fwd_s, fwd_tflops=fwd_flops / fwd_s / 1e12, fwd_runs=fwd_runs)
    bwd_s, bwd_runs = time_call(backward, device)
    row.update(bwd_ms=1e3 * bwd_s, bwd_tflops=2.5 * fwd_flops / bwd_s / 1e12, bwd_runs=bwd_runs)
    del q, k, v, dout, out


def parse_shape(text):
    hq, hkv, d = (int(x) for x in text.split("x"))
    if hq % hkv:
        raise argparse.ArgumentTypeError(f"--shapes: {text}: Hq is not a multiple of Hkv")
    return hq, hkv, d


def cmd_attn(args):
    for dtype in listed(args.dtype):
        for seq_len in listed(args.lens, int):
            for shape in listed(args.shapes, parse_shape):
                row = {"bench": "attn", "impl": "torch", "peer": "sdpa", "backend": args.device, "dtype": dtype,
                       "seqs": args.seqs, "seq_len": seq_len, "hq": shape[0], "hkv": shape[1], "head_dim": shape[2]}
                finish(row, lambda r, dt=dtype, s=seq_len, sh=shape: attn_one(args, dt, s, sh, r))


# ---- arguments ----

TINY = {"model": "tiny", "batch": "1,4", "prompt_len": 16, "new_tokens": 24, "copy_mb": 64, "lens": "64,128",
        "shapes": "4x4x16,4x2x32", "steps": 3, "warmup": 1}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["env", "sft", "gen", "attn", "copy"])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="tiny sizes (for CPU checks)")
    p.add_argument("--model", default="0.5b", help="comma list of 0.5b, 1.5b, tiny (gen: one model)")
    p.add_argument("--mode", default="full,lora", help="sft: comma list of full, lora")
    p.add_argument("--dtype", default=None, help="sft/gen: bf16 (default) or f32; attn: comma list (default f32,bf16)")
    p.add_argument("--tokens", type=int, default=0, help="sft: tokens per step (default as sft_gpu)")
    p.add_argument("--seq-len", type=int, default=0, help="sft: tokens per row (default as sft_gpu)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--peak-tflops", type=float, default=0.0, help="the device's peak for MFU (0: none)")
    p.add_argument("--batch", default="1,32,256", help="gen: comma list of batch sizes")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--copy-mb", type=int, default=1024)
    p.add_argument("--seqs", type=int, default=4)
    p.add_argument("--lens", default="1024,2048,4096")
    p.add_argument("--shapes", default="16x16x128,16x2x128,16x16x64")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    if args.tiny:
        given = {a.lstrip("-").replace("-", "_") for a in sys.argv[1:] if a.startswith("--")}
        for key, value in TINY.items():
            if key not in given:
                setattr(args, key, value)
    for name in listed(args.model):
        if name not in MODELS:
            p.error(f"--model: unknown model '{name}' ({', '.join(MODELS)})")
    for mode in listed(args.mode):
        if mode not in ("full", "lora"):
            p.error(f"--mode: '{mode}' is not full or lora")
    if args.command == "attn":
        args.dtype = args.dtype or "f32,bf16"
        bad = [d for d in listed(args.dtype) if d not in DTYPES]
    else:
        args.dtype = args.dtype or "bf16"
        bad = [] if args.dtype in DTYPES else [args.dtype]
    if bad:
        p.error(f"--dtype: {', '.join(bad)} is not one of {', '.join(DTYPES)}")
    if args.command == "gen" and len(listed(args.model)) != 1:
        p.error("--model: gen takes one model")
    {"env": cmd_env, "sft": cmd_sft, "gen": cmd_gen, "attn": cmd_attn, "copy": cmd_copy}[args.command](args)
    sys.exit(worst)


if __name__ == "__main__":
    main()
