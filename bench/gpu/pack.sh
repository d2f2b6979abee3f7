#!/usr/bin/env bash
# bench/gpu/pack.sh — builds the GPU programs here and packs them, with the shared
# libraries the device machine lacks, into .devpack/ for one device call:
#
#   bash bench/gpu/pack.sh                 # then: run(command="bash bench/gpu/run.sh all", carry=[".devpack"])
#
# The device has the CUDA toolkit and driver, python3 with torch, and a newer glibc, but
# none of our Debian libraries (OpenBLAS, jansson, PCRE2, utf8proc, ZeroMQ, Criterion,
# libgomp, ...) and no way to install them. So:
#   .devpack/bin/         gpu_tests, sft_gpu, generate_gpu, attention_gpu, smelt-trainer,
#                         smelt-rollout, smelt-generate: built with CUDA=1 in build-gpu/,
#                         stripped
#   .devpack/lib.tar.xz   every shared library they load (per ldd), except glibc's, the
#                         CUDA driver and toolkit libraries, libstdc++ and libgcc_s (the
#                         device has those, newer); xz because OpenBLAS alone is 36 MB
#                         and the carried tree must stay under 64 MiB. run.sh unpacks it
#                         into .devpack/lib/ on the device.
#   .devpack/MANIFEST     what was packed, from which build, when
# Before writing anything, the packed libraries are unpacked into a scratch folder and
# every binary is checked with ldd against it: nothing may be missing but the CUDA
# libraries, which the device provides.
#
# Environment: JOBS (make -j, default 2), BUILD (default build-gpu), CUDA_ARCH (passed
# to make when set). Run from anywhere; it works in the repository root.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-build-gpu}
jobs=${JOBS:-2}
pack=.devpack
progs=(tests/gpu_tests bench/gpu/sft_gpu bench/gpu/generate_gpu bench/gpu/attention_gpu
       smelt-trainer smelt-rollout smelt-generate)

# Libraries the device has: glibc's own (a copy from another glibc breaks: they share
# private symbols), the CUDA driver and toolkit, and the GCC runtime that libstdc++ is.
provided='^(ld-linux.*|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libnsl|libmvec|libBrokenLocale|libthread_db|libc_malloc_debug|libnss_.*|libcuda|libcudart|libcublas|libcublasLt|libnvidia-.*|libstdc\+\+|libgcc_s)\.so'
# What the device provides and the check here therefore allows to be missing.
cuda_libs='^(libcuda|libcudart|libcublas|libcublasLt)\.so'

targets=()
for p in "${progs[@]}"; do targets+=("$build/$p"); done
echo "pack: make -j$jobs CUDA=1 BUILD=$build ${targets[*]}"
make -j"$jobs" CUDA=1 BUILD="$build" ${CUDA_ARCH:+CUDA_ARCH=$CUDA_ARCH} "${targets[@]}"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/bin" "$scratch/lib"

for p in "${progs[@]}"; do
    strip --strip-all -o "$scratch/bin/$(basename "$p")" "$build/$p"
done

# ldd lists the whole closure (libraries of libraries too). A library that ldd cannot
# find here is an error now, not on the device.
declare -A seen=()
for b in "$scratch"/bin/*; do
    if ldd "$b" | grep -q 'not found'; then
        echo "pack: $b has libraries ldd cannot find here:" >&2
        ldd "$b" | grep 'not found' >&2
        exit 1
    fi
    while read -r name path; do
        [[ $name =~ $provided ]] && continue
        [[ -n ${seen[$name]:-} ]] && continue
        seen[$name]=1
        cp -L "$path" "$scratch/lib/$name"
        chmod 0644 "$scratch/lib/$name"
    done < <(ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done

# The check the device will rely on: with only the packed libraries, every binary
# resolves everything but the CUDA libraries.
bad=0
for b in "$scratch"/bin/*; do
    missing=$(LD_LIBRARY_PATH="$scratch/lib" ldd "$b" | awk '/not found/ {print $1}' | grep -Ev "$cuda_libs" || true)
    if [[ -n $missing ]]; then
        echo "pack: $(basename "$b") would miss: $missing" >&2
        bad=1
    fi
done
[[ $bad == 0 ]] || exit 1

rm -rf "$pack"
mkdir -p "$pack/bin"
cp "$scratch"/bin/* "$pack/bin/"
tar -C "$scratch/lib" -cf - . | xz -9 -T"$jobs" > "$pack/lib.tar.xz"
{
    echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) from $root/$build (CUDA=1${CUDA_ARCH:+ CUDA_ARCH=$CUDA_ARCH})"
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
    echo "bin:"
    (cd "$pack/bin" && ls -l | awk 'NR > 1 {printf "  %-16s %9d\n", $9, $5}')
    echo "lib.tar.xz (unpacked sizes):"
    (cd "$scratch/lib" && ls -l | awk 'NR > 1 {printf "  %-24s %9d\n", $9, $5}')
} > "$pack/MANIFEST"
cat "$pack/MANIFEST"
size=$(du -sb "$pack" | cut -f1)
echo "pack: $pack is $((size / 1024)) KiB ($(du -sh "$pack" | cut -f1)); libraries unpack to $(du -sh "$scratch/lib" | cut -f1)"
if (( size > 40 * 1024 * 1024 )); then
    echo "pack: $pack is over 40 MiB: the carried tree must stay under 64 MiB" >&2
    exit 1
fi
