#!/usr/bin/env bash
# Runs one libFuzzer harness for SECONDS over its seed corpus (fuzz/corpus/<harness>/) and prints
# one summary line. New inputs go to WORKDIR/corpus and findings to WORKDIR/artifacts, never into
# the source tree. Exits non-zero on any crash, leak, timeout, out-of-memory or sanitizer report.
# With "fresh", WORKDIR/corpus starts empty (the ctest smokes: every run starts from the seeds).
#   fuzz/run.sh BINARY SECONDS WORKDIR [fresh]
set -uo pipefail
bin=$1 seconds=$2 work=$3
name=$(basename "$bin")
here=$(cd "$(dirname "$0")" && pwd)
[ "${4:-}" = fresh ] && rm -rf "$work/corpus"
mkdir -p "$work/corpus" "$work/artifacts"
# The harnesses' scratch files (fuzz_support.h), removed here: a timed run ends past their atexit.
LINEAGE_FUZZ_SCRATCH=$(mktemp -d /dev/shm/lineage_fuzz_run.XXXXXX 2>/dev/null || mktemp -d)
export LINEAGE_FUZZ_SCRATCH
trap 'rm -rf "$LINEAGE_FUZZ_SCRATCH"' EXIT
# Huge allocations are findings: no single malloc over 1 GiB, no more than 2 GiB resident.
# -timeout: one input that takes 10 s is a hang.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
"$bin" "$work/corpus" "$here/corpus/$name" -dict="$here/lineage.dict" -max_total_time="$seconds" \
  -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" >"$work/log" 2>&1
rc=$?
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
cov=$(grep -o 'cov: [0-9]*' "$work/log" | tail -1)
files=$(find "$work/corpus" -type f | wc -l)
if [ $rc -ne 0 ]; then
  echo "$name: FAILED (exit $rc) after ${runs:-?} runs; log $work/log; input in $work/artifacts/"
  grep -E -m 20 'ERROR|WARNING|SUMMARY|runtime error|invariant violated|what\(\)|==[0-9]+==|#[0-9]+ 0x' "$work/log" | head -40
  exit 1
fi
echo "$name: ${runs:-?} runs in ${seconds} s, ${cov:-cov: ?}, ${files} new corpus files, no findings"
