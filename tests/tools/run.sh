#!/bin/sh
# End-to-end checks of the command-line programs on a tiny random model.
# Run by `make test` (test-tools) with BUILD set to the build folder.
set -eu
B=${BUILD:-build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0; passes=0
ok()   { passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# the folder rule: other folders include only a folder's public header
python3 tests/tools/check_includes.py >"$T/inc" && ok || fail "folder rule: $(cat "$T/inc")"

# init: a random tiny Llama with the byte tokenizer
"$B/smelt-model" init --config tests/data/tiny/config.json --out "$T/m" --seed 1 --byte-tokenizer >/dev/null \
  && ok || fail "smelt-model init"
[ -f "$T/m/model.safetensors" ] && [ -f "$T/m/config.json" ] && [ -f "$T/m/tokenizer.json" ] && ok || fail "init wrote the directory"
"$B/smelt-model" info --model "$T/m" | grep -q "llama, 2 layers" && ok || fail "smelt-model info"

# greedy generation is deterministic and has the requested length
a=$("$B/smelt-generate" --model "$T/m" --prompt "hello" --max-new-tokens 8 --json)
b=$("$B/smelt-generate" --model "$T/m" --prompt "hello" --max-new-tokens 8 --json)
[ "$a" = "$b" ] && ok || fail "greedy generation differs between runs"
echo "$a" | grep -q '"finish_reason":"length"' && ok || fail "finish_reason length: $a"
n=$(echo "$a" | sed 's/.*"ids":\[\([^]]*\)\].*/\1/' | tr ',' '\n' | wc -l)
[ "$n" -eq 8 ] && ok || fail "8 tokens expected, got $n: $a"

# sampling with a seed is reproducible
a=$("$B/smelt-generate" --model "$T/m" --prompt-ids 104,105 --temperature 1 --top-p 0.9 --seed 5 --max-new-tokens 6)
b=$("$B/smelt-generate" --model "$T/m" --prompt-ids 104,105 --temperature 1 --top-p 0.9 --seed 5 --max-new-tokens 6)
[ "$a" = "$b" ] && ok || fail "seeded sampling differs between runs"

# smelt-lora: the adapter applied unmerged gives the merged model's logits, and not the base's
P=tests/data/parity/llama
"$B/smelt-lora" logits --model $P --adapter $P-lora --ids 1,5,9,2 >"$T/lora.json" && ok || fail "smelt-lora logits"
"$B/smelt-lora" merge --model $P --adapter $P-lora --out "$T/merged" >/dev/null && ok || fail "smelt-lora merge"
"$B/smelt-model" logits --model "$T/merged" --ids 1,5,9,2 >"$T/merged.json" && ok || fail "logits of the merged model"
"$B/smelt-model" logits --model $P --ids 1,5,9,2 >"$T/base.json" && ok || fail "logits of the base model"
python3 - "$T" <<'PY' && ok || fail "adapter logits vs merged/base"
import json, sys
d = sys.argv[1]
a, m, b = (sum(json.load(open(f"{d}/{n}.json"))["logits"], []) for n in ("lora", "merged", "base"))
close = max(abs(x - y) / (1 + abs(y)) for x, y in zip(a, m))
apart = max(abs(x - y) for x, y in zip(a, b))
print(f"lora vs merged: {close:.2e}, lora vs base: {apart:.2e}")
sys.exit(0 if close < 1e-4 and apart > 1e-3 else 1)
PY
"$B/smelt-lora" save --model $P --adapter $P-lora --out "$T/saved" >/dev/null && ok || fail "smelt-lora save"
"$B/smelt-lora" logits --model $P --adapter "$T/saved" --ids 1,5,9,2 | cmp -s - "$T/lora.json" && ok || fail "saved adapter gives other logits"
if "$B/smelt-lora" merge --model $P --out "$T/y" 2>"$T/err"; then fail "merge without --adapter accepted"; else
  grep -q -- "--adapter" "$T/err" && ok || fail "missing --adapter not named: $(cat "$T/err")"; fi

# --json prints one JSON line even when the sampled bytes are not valid UTF-8 (random
# byte-tokenizer output mostly is not): the text carries U+FFFD for them
for s in 1 2 3 4 5; do
  "$B/smelt-generate" --model "$T/m" --prompt-ids 104,105 --temperature 1 --seed $s --max-new-tokens 6 --json
done | python3 -c 'import json, sys; rows = [json.loads(l) for l in sys.stdin]; sys.exit(len(rows) != 5 or not all("text" in r for r in rows))' \
  && ok || fail "smelt-generate --json lost a sample"

# bad input: clear errors naming the field, non-zero exit
if "$B/smelt-generate" --model "$T/m" --prompt x --top-p 2 2>"$T/err"; then fail "--top-p 2 accepted"; else
  grep -q -- "--top-p" "$T/err" && ok || fail "--top-p error does not name the flag: $(cat "$T/err")"; fi
if "$B/smelt-generate" --model "$T/m" --prompt-ids 1,999 2>"$T/err"; then fail "id 999 accepted"; else
  grep -q "999" "$T/err" && ok || fail "out-of-vocabulary error: $(cat "$T/err")"; fi
if "$B/smelt-generate" --model "$T/nope" --prompt x 2>"$T/err"; then fail "missing model accepted"; else ok; fi
if "$B/smelt-model" init --config tests/data/parity/llama/config.json --out "$T/x" --byte-tokenizer >/dev/null 2>"$T/err"; then
  fail "byte tokenizer on a 96-token vocabulary accepted"; else grep -q "vocab_size" "$T/err" && ok || fail "vocab error: $(cat "$T/err")"; fi

# smelt-trainer: a short SFT run, SIGTERM checkpoints and --resume finishes it
i=0; : >"$T/train.jsonl"
for w in ab cd ef gh ij kl mn op qr st uv wx; do
  r=$(echo "$w" | rev); echo "{\"prompt\": \"$w>\", \"completion\": \"$r\"}" >>"$T/train.jsonl"; done
cat >"$T/job.json" <<EOS
{"type": "sft", "model": "$T/m", "data": {"train": "$T/train.jsonl", "validation_fraction": 0.25},
 "hyperparameters": {"max_steps": 1000, "batch_size": 4, "learning_rate": 0.003},
 "eval": {"accuracy_examples": 3}, "output_dir": "$T/run"}
EOS
"$B/smelt-trainer" --spec "$T/job.json" >"$T/trainer.out" 2>&1 &
pid=$!
for _ in $(seq 1 200); do grep -q '"type":"train"' "$T/trainer.out" 2>/dev/null && break; sleep 0.05; done
kill -TERM "$pid"; wait "$pid" && ok || fail "smelt-trainer did not exit cleanly on SIGTERM: $(tail -3 "$T/trainer.out")"
ls "$T/run/checkpoints" | grep -q '^step-' && ok || fail "SIGTERM left no checkpoint"
# the resumed run with a kernel set chosen by hand: the variable is respected, and each
# start line names the kernels that ran
OPENBLAS_CORETYPE=Prescott "$B/smelt-trainer" --spec "$T/job.json" --resume --quiet >"$T/resume.out" 2>&1 && ok || fail "resume: $(tail -3 "$T/resume.out")"
python3 - "$T/run/metrics.jsonl" <<'PY' && ok || fail "start lines do not name the BLAS kernels"
import json, sys
starts = [r["compute"] for r in map(json.loads, open(sys.argv[1])) if r["type"] == "start"]
print("start lines:", starts)
sys.exit(not (len(starts) == 2 and starts[0]["blas_kernels"] not in ("", "unknown")
              and starts[1]["blas_kernels"] == "Prescott" and all(s["cpu_threads"] >= 1 for s in starts)))
PY
grep -q "^accuracy: " "$T/resume.out" && ok || fail "no accuracy line: $(tail -3 "$T/resume.out")"
[ -f "$T/run/output/model.safetensors" ] && [ -f "$T/run/output/tokenizer.json" ] && ok || fail "no output model"
n=$(grep -c '"type":"train"' "$T/run/metrics.jsonl"); [ "$n" -eq 1000 ] && ok || fail "metrics.jsonl has $n train lines, expected 1000"
sed 's/"max_steps": 1000/"max_steps": 1000, "warmup": 3/' "$T/job.json" >"$T/bad.json"
if "$B/smelt-trainer" --spec "$T/bad.json" 2>"$T/err"; then fail "unknown spec field accepted"; else
  grep -q "warmup" "$T/err" && ok || fail "spec error does not name the field: $(cat "$T/err")"; fi

# bench/comm_cpu, smelt's half at two small sizes: every row has a time (a collective that
# fails prints its error in its row), and bad flags are named
"$B/bench/comm_cpu" --no-torch --ranks 2 --max-size 16384 --timeout-ms 20000 >"$T/comm.out" 2>&1 \
  && ok || fail "comm_cpu: $(tail -3 "$T/comm.out")"
n=$(grep -cE '^(all_reduce|reduce_scatter|all_gather|broadcast) +[0-9]+ KiB +[0-9]+ +[0-9.]+ +[0-9.]+ ' "$T/comm.out")
[ "$n" -eq 8 ] && ! grep -q "smelt:" "$T/comm.out" && ok || fail "comm_cpu: $n of 8 rows timed: $(cat "$T/comm.out")"
if "$B/bench/comm_cpu" --ranks 3 2>"$T/err"; then fail "comm_cpu --ranks 3 accepted"; else
  grep -q -- "--ranks" "$T/err" && ok || fail "comm_cpu error does not name --ranks: $(cat "$T/err")"; fi

# bench/tokenizer_cpu on its defaults (Qwen3, tests/data's texts): the batch's ids are the
# serial ones, GPT-2's count is the vectors' (5105 ids), and a bad flag is named
"$B/bench/tokenizer_cpu" >"$T/tok.out" 2>&1 && grep -q '"batch_same_ids": true' "$T/tok.out" \
  && ok || fail "tokenizer_cpu: $(cat "$T/tok.out")"
"$B/bench/tokenizer_cpu" --tokenizer tests/data/tokenizers/gpt2 --rounds 1 | grep -q '"tokens": 5105,' \
  && ok || fail "tokenizer_cpu on GPT-2"
if "$B/bench/tokenizer_cpu" --rounds 0 2>"$T/err"; then fail "tokenizer_cpu --rounds 0 accepted"; else
  grep -q -- "--rounds" "$T/err" && ok || fail "tokenizer_cpu error does not name --rounds: $(cat "$T/err")"; fi

echo "tools: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
