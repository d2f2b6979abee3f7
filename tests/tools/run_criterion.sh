#!/usr/bin/env bash
# Runs a Criterion test binary with its arguments, printing its whole output as it goes,
# and — when it fails — ends with the failing tests' assertions again. CI keeps only the
# tail of a long output, and with --jobs the failure itself scrolls away among the later
# tests' logs; the summary puts the names and messages where they are read.
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  echo "== failing tests of $1 (exit $rc):"
  grep -E -A5 '^\[----\] .*(Assertion Failed|Unexpected signal|Timed out)|^\[(FAIL|CRASH|TIME)\]' "$log" \
    | grep -E '^\[|^--' | head -150
fi
exit "$rc"
