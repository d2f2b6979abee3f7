#!/usr/bin/env python3
"""The markdown tables of a GPU benchmark run: smelt next to its PyTorch peer.

    python3 bench/gpu/report.py results.jsonl [more.jsonl ...]

Reads the JSON lines of bench/gpu's programs (impl "smelt") and of peers.py (impl
"torch"); other lines are ignored. One table per benchmark (sft, gen, attn, copy), a
smelt row next to the peer row of the same configuration, then every row that measured
nothing with its reason, and warnings where the two sides counted differently (FLOPs or
parameters of the same configuration), which would make their MFUs incomparable.
bench/gpu/README.md says what each column means.
"""
import json
import sys


def load(paths):
    rows = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    print(f"report: {path}:{n}: not JSON ({e}); skipped", file=sys.stderr)
    return rows


G3 = "{:.3g}"  # three significant digits: TFLOP/s, GB/s, milliseconds


def num(x, fmt="{:.0f}"):
    return "-" if x is None else fmt.format(x)


def pct(x):
    return "-" if x is None else f"{100 * x:.3g}%"


def ratio(a, b):
    return f"{a / b:.2f}" if a and b else "-"


def cell(row, key, fmt="{:.0f}"):
    """A number, or the row's status when it measured nothing, or '-' without a row."""
    if row is None:
        return "-"
    if row.get("status") != "ok":
        return row.get("status", "?")
    return num(row.get(key), fmt)


def value(row, key):
    return row.get(key) if row and row.get("status") == "ok" else None


def table(header, lines):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in line) + " |" for line in lines]
    return "\n".join(out)


def pairs(rows, bench, key):
    """(smelt row, peer row) for each smelt row of bench, the peer matched on key(row);
    peer rows without a smelt row come last, alone."""
    smelt = [r for r in rows if r.get("bench") == bench and r.get("impl") == "smelt"]
    peers = [r for r in rows if r.get("bench") == bench and r.get("impl") == "torch"]
    used, out = set(), []
    for s in smelt:
        match = next((p for p in peers if key(p) == key(s)), None)
        if match is not None:
            used.add(id(match))
        out.append((s, match))
    out += [(None, p) for p in peers if id(p) not in used]
    return out


def sft_table(rows, warnings):
    lines = []
    for s, p in pairs(rows, "sft", lambda r: (r.get("model"), r.get("mode"))):
        any_row = s or p
        for what in ("params", "trainable_params", "flops_per_step"):
            a, b = value(s, what), value(p, what)
            if a and b and abs(a / b - 1) > 1e-6:
                warnings.append(f"sft {any_row['model']} {any_row['mode']}: {what} differs (smelt {a:.6g}, torch {b:.6g})")
        lines.append([any_row.get("model"), any_row.get("mode"),
                      f"{any_row.get('tokens', '?')} ({any_row.get('seq_len', '?')})",
                      s.get("backend") if s else "-", s.get("dtype") if s else "-",
                      cell(s, "tokens_per_s"), cell(s, "step_ms", G3), pct(value(s, "mfu")),
                      p.get("dtype") if p else "-", cell(p, "tokens_per_s"), cell(p, "step_ms", G3),
                      pct(value(p, "mfu")), ratio(value(s, "tokens_per_s"), value(p, "tokens_per_s"))])
    return table(["model", "mode", "tokens/step (seq)", "smelt backend", "smelt dtype", "smelt tok/s",
                  "smelt step ms", "smelt MFU", "torch dtype", "torch tok/s", "torch step ms", "torch MFU",
                  "smelt/torch"], lines)


def gen_table(rows):
    lines = []
    for s, p in pairs(rows, "gen", lambda r: (r.get("model"), r.get("batch"))):
        any_row = s or p
        lines.append([any_row.get("model"), any_row.get("batch"), s.get("backend") if s else "-",
                      cell(s, "tokens_per_s"), cell(p, "tokens_per_s"),
                      ratio(value(s, "tokens_per_s"), value(p, "tokens_per_s")),
                      cell(s, "decode_step_ms", G3), cell(p, "decode_step_ms", G3),
                      cell(s, "decode_gbps", G3), pct(value(s, "bw_fraction")),
                      cell(p, "decode_gbps", G3), pct(value(p, "bw_fraction"))])
    return table(["model", "batch", "smelt backend", "smelt tok/s", "torch tok/s", "smelt/torch",
                  "smelt decode ms", "torch decode ms", "smelt decode GB/s", "smelt % of copy",
                  "torch decode GB/s", "torch % of copy"], lines)


def attn_table(rows):
    lines = []
    key = lambda r: (r.get("dtype"), r.get("seqs"), r.get("seq_len"), r.get("hq"), r.get("hkv"), r.get("head_dim"))
    for s, p in pairs(rows, "attn", key):
        r = s or p
        lines.append([r.get("dtype"), f"{r.get('seqs')}x{r.get('seq_len')}",
                      f"{r.get('hq')}/{r.get('hkv')}/{r.get('head_dim')}", s.get("backend") if s else "-",
                      cell(s, "fwd_tflops", G3), cell(p, "fwd_tflops", G3),
                      ratio(value(s, "fwd_tflops"), value(p, "fwd_tflops")),
                      cell(s, "bwd_tflops", G3), cell(p, "bwd_tflops", G3),
                      ratio(value(s, "bwd_tflops"), value(p, "bwd_tflops"))])
    return table(["dtype", "seqs x len", "Hq/Hkv/D", "smelt backend", "smelt fwd TFLOP/s", "torch fwd TFLOP/s",
                  "fwd smelt/torch", "smelt bwd TFLOP/s", "torch bwd TFLOP/s", "bwd smelt/torch"], lines)


def copy_table(rows):
    lines = [[r.get("impl"), r.get("backend"), r.get("mb"), cell(r, "gbps", G3)]
             for r in rows if r.get("bench") == "copy"]
    return table(["impl", "backend", "MiB", "GB/s (read + write)"], lines)


def describe(r):
    keys = ("model", "mode", "batch", "dtype", "seq_len", "hq", "hkv", "head_dim")
    return " ".join(f"{k}={r[k]}" for k in keys if k in r)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: report.py results.jsonl [more.jsonl ...]")
    rows = load(sys.argv[1:])
    env = next((r for r in rows if r.get("bench") == "env"), {})
    if env:
        print(f"PyTorch side: torch {env.get('torch')}, transformers {env.get('transformers')}, "
              f"peft {env.get('peft')}, device {env.get('device_name', 'none (CPU)')}.\n")
    warnings = []
    sections = [("SFT step (median)", lambda: sft_table(rows, warnings)), ("Generation", lambda: gen_table(rows)),
                ("Attention, causal", lambda: attn_table(rows)), ("Device copy", lambda: copy_table(rows))]
    for title, make in sections:
        print(f"### {title}\n\n{make()}\n")
    # Rows without numbers, one line per bench, side, backend and reason.
    groups = {}
    for r in rows:
        if r.get("bench") != "env" and r.get("status") != "ok":
            key = (r.get("bench"), r.get("impl"), r.get("backend"), r.get("status"), r.get("error", ""))
            groups.setdefault(key, []).append(r)
    if groups:
        print("### Rows without numbers\n")
        for (bench, impl, backend, status, error), members in groups.items():
            which = f"{len(members)} rows" if len(members) > 1 else describe(members[0]) or "1 row"
            print(f"- {bench} {impl} on {backend}, {which}: {status}: {error}")
        print()
    for w in warnings:
        print(f"WARNING: {w}")


if __name__ == "__main__":
    main()
