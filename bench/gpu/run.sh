#!/usr/bin/env bash
# bench/gpu/run.sh — the GPU tests and benchmarks in one device call (bench/gpu/README.md).
#
#   bash bench/gpu/run.sh [all|tests|sft|gen|attn|tiny]...      (no argument: all)
#
#   all     tests sft gen attn
#   tests   tests/gpu's gpu_tests through tests/gpu/run.sh (prints the counts)
#   sft     sft_gpu, 0.5b and 1.5b, LoRA and full; peers.py sft
#   gen     generate_gpu, 0.5b, batch 1, 32, 256 (and the device copy rate); peers.py gen
#   attn    attention_gpu, f32 and bf16; peers.py attn
#   tiny    (with the others, or SMELT_BENCH_TINY=1) tiny sizes: the smelt programs on the
#           CUDA backend and on the CPU backend, the peers on CUDA when torch sees a GPU,
#           else on the CPU. For checking this script on a machine without a GPU, or a
#           quick first look on one.
#
# Binaries: $BUILD/... when BUILD is set (a build with CUDA=1), else .devpack/ as
# bench/gpu/pack.sh makes it (its lib.tar.xz is unpacked into a temporary folder, removed
# at the end).
# The smelt programs run with LD_LIBRARY_PATH = the packed libraries, /usr/local/cuda's
# and any nvidia/*/lib of python3's site-packages; the peers run with the environment
# as it was.
#
# Output, under $OUT (or ./bench-out): results.jsonl (every JSON row, smelt and peer),
# log.txt (everything every command printed), gpu_tests.txt, report.md (the tables,
# bench/gpu/report.py). Every command has a time limit, and the whole run a budget
# (SMELT_BENCH_BUDGET_S, default 520 s): a command that would start with less than 20 s
# left is skipped and says so. A command that fails is reported and the next one runs.
#
# Environment: SMELT_PEAK_TFLOPS (the GPU's peak for MFU; default from the GPU's name:
# the dense bf16 tensor-core peak, README.md), SMELT_CPU_PEAK_TFLOPS (tiny CPU rows,
# default 0.1, a nominal figure), PYTHON (default python3).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
tiny=${SMELT_BENCH_TINY:-0}
parts=()
for a in "$@"; do
    case $a in
        all) parts+=(tests sft gen attn) ;;
        tests | sft | gen | attn) parts+=("$a") ;;
        tiny) tiny=1 ;;
        -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown part '$a' (all, tests, sft, gen, attn, tiny)" >&2; exit 2 ;;
    esac
done
[[ ${#parts[@]} -gt 0 ]] || parts=(tests sft gen attn)
want() { [[ " ${parts[*]} " == *" $1 "* ]]; }

out=${OUT:-$root/bench-out}
mkdir -p "$out" || exit 1
results=$out/results.jsonl log=$out/log.txt
: > "$results"
: > "$log"
budget=${SMELT_BENCH_BUDGET_S:-520}
summary=()
say() { echo "$*" | tee -a "$log"; }

# ---- binaries and libraries ----

if [[ -n ${BUILD:-} ]]; then
    bin_of() { case $1 in gpu_tests) echo "$BUILD/tests/gpu_tests" ;; smelt-*) echo "$BUILD/$1" ;; *) echo "$BUILD/bench/gpu/$1" ;; esac; }
    libdirs=""
elif [[ -d .devpack/bin ]]; then
    bin_of() { echo ".devpack/bin/$1"; }
    # Unpacked outside the tree: .devpack must stay as small as pack.sh made it, since
    # it is what travels to the device.
    unpacked=$(mktemp -d "${TMPDIR:-/tmp}/smelt-devpack-lib.XXXXXX") || exit 1
    trap 'rm -rf "$unpacked"' EXIT
    "$python" -c 'import sys, tarfile
t = tarfile.open(sys.argv[1])
t.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))' \
        .devpack/lib.tar.xz "$unpacked" || { echo "run.sh: could not unpack .devpack/lib.tar.xz" >&2; exit 1; }
    libdirs=$unpacked
else
    echo "run.sh: no binaries: make .devpack with bench/gpu/pack.sh, or set BUILD to a CUDA=1 build folder" >&2
    exit 1
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $("$python" -c 'import glob, site
print(" ".join(sorted({d.rsplit("/", 1)[0] for s in site.getsitepackages()
                       for p in ("libcublas.so.*", "libcudart.so.*") for d in glob.glob(f"{s}/nvidia/*/lib/{p}")})))' \
                 2>/dev/null); do
    [[ -d $d ]] && libdirs=${libdirs:+$libdirs:}$d
done
smelt_env=(env "LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")

say "== run.sh ${parts[*]} (tiny=$tiny) $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
say "LD_LIBRARY_PATH for smelt: $libdirs"
for b in gpu_tests sft_gpu generate_gpu attention_gpu; do
    missing=$("${smelt_env[@]}" ldd "$(bin_of $b)" 2>&1 | grep 'not found')
    [[ -z $missing ]] || say "run.sh: $b cannot find: $missing"
done

gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case ${SMELT_PEAK_TFLOPS:-} in
    "") case $gpu_name in
            *H100*PCIe*) peak=756 ;;
            *H100*NVL*) peak=835 ;;
            *H100* | *H200* | *GH200*) peak=989 ;;
            *A100*) peak=312 ;;
            *) peak=0 ;;
        esac ;;
    *) peak=$SMELT_PEAK_TFLOPS ;;
esac
say "GPU: ${gpu_name:-none}; peak for MFU: $peak TFLOP/s (0: MFU not reported)"
cpu_peak=${SMELT_CPU_PEAK_TFLOPS:-0.1}
peer_device=cuda
if [[ $tiny == 1 ]] && ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    peer_device=cpu
fi

# ---- running one command ----

# step NAME LIMIT_S CMD...: runs CMD under timeout with what is left of the budget, keeps
# its JSON lines in results.jsonl and all its output in log.txt, and records a summary.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((budget - SECONDS))
    if ((left < 20)); then
        summary+=("$name: skipped, ${left}s of the ${budget}s budget left")
        say "== $name: skipped (time budget)"
        return
    fi
    ((limit > left)) && limit=$left
    local shown="$*"
    say "== $name (limit ${limit}s): ${shown#"${smelt_env[*]} "}"
    local t0=$SECONDS tmp rc
    tmp=$(mktemp)
    timeout -k 10 "$limit" "$@" > "$tmp" 2>&1
    rc=$?
    cat "$tmp" >> "$log"
    grep '^{' "$tmp" >> "$results"
    grep -v '^{' "$tmp" | tail -n 5
    rm -f "$tmp"
    local what
    case $rc in
        0) what="ok" ;;
        3) what="some rows unsupported (see report)" ;;
        124 | 137) what="TIMED OUT after ${limit}s" ;;
        *) what="FAILED (exit $rc)" ;;
    esac
    summary+=("$name: $what, $((SECONDS - t0))s")
    say "-- $name: $what ($((SECONDS - t0))s)"
}

peers() { step "$1" "$2" "$python" bench/gpu/peers.py "${@:3}" --device "$peer_device" $([[ $tiny == 1 ]] && echo --tiny); }

# ---- the parts ----

peers "torch environment" 90 env

if want tests; then
    # tests/gpu/run.sh prints the Criterion summary and how many were skipped.
    step "gpu tests" 180 "${smelt_env[@]}" sh tests/gpu/run.sh "$(bin_of gpu_tests)"
    sed -n '/== gpu tests/,/-- gpu tests/p' "$log" > "$out/gpu_tests.txt"
fi

if [[ $tiny == 1 ]]; then
    backends=(cuda cpu)
    sft_models=(tiny)
    gen_args=(--model tiny --batch 1,4 --prompt-len 16 --new-tokens 24 --copy-mb 64)
    attn_args=(--lens 64,128 --shapes 4x4x16,4x2x32)
    sft_args=(--steps 3 --warmup 1)
else
    backends=(cuda)
    sft_models=(0.5b 1.5b)
    gen_args=(--model 0.5b --batch 1,32,256)
    attn_args=()
    sft_args=()
fi
peak_of() { [[ $1 == cpu ]] && echo "$cpu_peak" || echo "$peak"; }

if want sft; then
    for b in "${backends[@]}"; do
        # One process per model, both modes: the random init of the weights is paid once.
        for m in "${sft_models[@]}"; do
            step "sft smelt $m $b" $([[ $m == 1.5b ]] && echo 240 || echo 150) "${smelt_env[@]}" \
                "$(bin_of sft_gpu)" --model "$m" --mode lora,full --backend "$b" --peak-tflops "$(peak_of "$b")" \
                "${sft_args[@]}" --json
        done
    done
    models=$([[ $tiny == 1 ]] && echo tiny || echo 0.5b,1.5b)
    peers "sft torch" 240 sft --model "$models" --mode full,lora \
        --peak-tflops "$(peak_of "$peer_device")"
fi

if want gen; then
    for b in "${backends[@]}"; do
        step "gen smelt $b" 240 "${smelt_env[@]}" "$(bin_of generate_gpu)" --backend "$b" "${gen_args[@]}" --json
    done
    if [[ $tiny == 1 ]]; then peers "gen torch" 180 gen; else peers "gen torch" 180 gen --model 0.5b; fi
fi

if want attn; then
    for b in "${backends[@]}"; do
        step "attn smelt $b" 150 "${smelt_env[@]}" "$(bin_of attention_gpu)" --backend "$b" "${attn_args[@]}" --json
    done
    peers "attn torch" 150 attn
fi

# ---- the report ----

{
    echo
    echo "## Steps"
    printf -- '- %s\n' "${summary[@]}"
    echo
    "$python" bench/gpu/report.py "$results"
    echo
    echo "## GPU"
    echo
    echo '```'
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
    else
        echo "nvidia-smi: not found (no NVIDIA driver here)"
    fi
    echo '```'
} > "$out/report.md" 2>&1
cat "$out/report.md" | tee -a "$log"
say "results: $out (results.jsonl, report.md, log.txt$(want tests && echo ', gpu_tests.txt'))"
