"""Encode throughput of smelt's tokenizer next to Hugging Face `tokenizers`, on the same
tokenizer files and the same texts, in one run (issue 27, item 5).

    python3 bench/tokenizer.py [--bench build-cpu/bench/tokenizer_cpu] [--mb 2] [--rounds 3]

Tokenizers: GPT-2 (byte-level BPE; the tokenizer.json `tokenizers` builds from
tests/data/tokenizers/gpt2's encoder.json and vocab.bpe), Qwen3 (byte-level BPE with an NFC
normalizer and added tokens; tests/data/tokenizers/qwen3/tokenizer.json) and a
SentencePiece-style one (BPE with byte fallback and a Metaspace pre-tokenizer, as Llama 2
and Mistral write theirs) that `tokenizers` trains here on the texts, with a vocabulary of
--metaspace-vocab pieces. Both sides read the same tokenizer.json.

Texts: the lines of tests/data/tokenizers/vectors.jsonl (prose, code, many scripts, emoji)
and the paragraphs of the repository's Markdown files, repeated to about --mb megabytes.
Modes: "serial" encodes the texts one after another on one thread (smelt:
tokenizer_encode; `tokenizers`: Tokenizer.encode in a loop, as a data loader calls it);
"batch" encodes them all in one call on every core (smelt: tokenizer_encode_batch on its
OpenMP pool; `tokenizers`: encode_batch on its Rayon pool). No thread variable is set: each
library runs with its defaults. Special tokens in the text are encoded as plain text on
both sides (smelt's allow_special false; `tokenizers`' encode_special_tokens), no BOS/EOS
added. Each mode's fastest of --rounds rounds counts; the ids of every text must agree
(an FNV-1a hash over all ids, computed on both sides)."""
import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DATA = os.path.join(ROOT, "tests", "data", "tokenizers")


def corpus(mb):
    """The texts: vectors.jsonl's and the Markdown paragraphs, repeated to about mb MB."""
    base = []
    with open(os.path.join(DATA, "vectors.jsonl"), encoding="utf-8") as f:
        base += [json.loads(line)["text"] for line in f if line.strip()]
    for path in sorted(glob.glob(os.path.join(ROOT, "**", "*.md"), recursive=True)):
        if "/build" in path:
            continue
        with open(path, encoding="utf-8") as f:
            base += [p for p in f.read().split("\n\n") if p.strip()]
    size = sum(len(t.encode()) for t in base)
    texts = base * max(1, round(mb * 1e6 / size))
    return texts


def gpt2_json(tmp):
    """GPT-2's encoder.json and vocab.bpe as a tokenizer.json, built by `tokenizers`."""
    tok = Tokenizer(models.BPE.from_file(os.path.join(DATA, "gpt2", "encoder.json"),
                                         os.path.join(DATA, "gpt2", "vocab.bpe")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    path = os.path.join(tmp, "gpt2.json")
    tok.save(path)
    return path


def metaspace_json(tmp, texts, vocab):
    """A SentencePiece-style BPE trained on texts: byte fallback, Metaspace pre-tokenizer
    (prepend_scheme first), the <0xNN> byte pieces, Llama's decoder chain."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    path = os.path.join(tmp, "metaspace.json")
    tok.save(path)
    return path


def fnv1a(ids_lists):
    h = 14695981039346656037
    for ids in ids_lists:
        for i in ids:
            for b in (i & 0xFFFFFFFF).to_bytes(4, "little"):
                h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def hf_run(path, texts, rounds):
    tok = Tokenizer.from_file(path)
    tok.encode_special_tokens = True
    best = {"serial": None, "batch": None}
    ids = None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = [tok.encode(t, add_special_tokens=False).ids for t in texts]
        s = time.perf_counter() - t0
        best["serial"] = s if best["serial"] is None else min(best["serial"], s)
        ids = out
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = tok.encode_batch(texts, add_special_tokens=False)
        s = time.perf_counter() - t0
        best["batch"] = s if best["batch"] is None else min(best["batch"], s)
    same = [e.ids for e in out] == ids
    return best, ids, same


def smelt_run(bench, path, texts_path, rounds):
    out = subprocess.run([bench, "--tokenizer", path, "--texts", texts_path, "--rounds", str(rounds)],
                         capture_output=True, text=True, check=False)
    if out.returncode:
        sys.exit("tokenizer_cpu failed: " + out.stderr)
    return json.loads(out.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", default=os.path.join(ROOT, "build-cpu", "bench", "tokenizer_cpu"))
    p.add_argument("--mb", type=float, default=2.0, help="megabytes of text (default 2)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--metaspace-vocab", type=int, default=8000)
    args = p.parse_args()
    if not os.access(args.bench, os.X_OK):
        sys.exit("%s is missing: build it with `make CUDA=0 build-cpu/bench/tokenizer_cpu`" % args.bench)
    texts = corpus(args.mb)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    print("cpu: %s, %d online cores; tokenizers %s, Python %s; %d texts, %.2f MB; fastest of %d rounds" % (
        cpu, os.cpu_count(), tokenizers.__version__, platform.python_version(), len(texts), mb, args.rounds))
    with tempfile.TemporaryDirectory(prefix="smelt-tok-bench-") as tmp:
        texts_path = os.path.join(tmp, "texts.jsonl")
        with open(texts_path, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps({"text": t}) + "\n")
        cases = [("gpt2", gpt2_json(tmp)), ("qwen3", os.path.join(DATA, "qwen3", "tokenizer.json")),
                 ("metaspace (trained, %d)" % args.metaspace_vocab,
                  metaspace_json(tmp, texts[:len(texts) // max(1, round(args.mb))], args.metaspace_vocab))]
        print("| tokenizer | tokens | serial MB/s smelt | serial MB/s HF | serial ratio | batch MB/s smelt "
              "| batch MB/s HF | batch ratio | threads (smelt) | ids equal |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, path in cases:
            hf, ids, hf_batch_same = hf_run(path, texts, args.rounds)
            sm = smelt_run(args.bench, path, texts_path, args.rounds)
            same = fnv1a(ids) == sm["ids_hash"] and sm["batch_same_ids"] and hf_batch_same
            rate = lambda s: mb / s  # noqa: E731
            print("| %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %d | %s |" % (
                name, sm["tokens"], rate(sm["serial_s"]), rate(hf["serial"]), hf["serial"] / sm["serial_s"],
                rate(sm["batch_s"]), rate(hf["batch"]), hf["batch"] / sm["batch_s"], sm["threads"],
                "yes" if same else "NO (%d ids from HF, %d from smelt)" % (sum(map(len, ids)), sm["tokens"])))


if __name__ == "__main__":
    main()
