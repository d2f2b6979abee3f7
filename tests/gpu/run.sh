#!/bin/sh
# Runs the GPU op tests and states how many were skipped: Criterion's summary counts
# only tests that ran, so without a GPU it would read "Tested: 0" with no reason given.
set -u
bin=$1
out=$("$bin" --verbose 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E '^\[(SKIP|FAIL|----)\]|Synthesis' || true
skipped=$(printf '%s\n' "$out" | grep -c '^\[SKIP\]' || true)
echo "gpu tests: $skipped skipped$( [ "$skipped" -gt 0 ] && echo ' (no CUDA device, or a build without CUDA)')"
exit $rc
