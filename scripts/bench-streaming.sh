#!/usr/bin/env bash
# The expert-streaming benchmark at real sizes (issue #40, docs/streaming.md). For each model it writes
# a synthetic checkpoint at the published shapes (scripts/make-stream-checkpoint.py: seeded random
# values, MXFP4 routed experts in compressed-tensors' layout), runs `lineage bench` on it under each
# budget, streaming (--memory-budget B, each cache policy), and then, in the same run, plain mmap with
# a balloon holding all but B of the memory available (the page cache gets B, as llama.cpp would run),
# and deletes the checkpoint before the next one. Not part of the test suite.
#
#   scripts/bench-streaming.sh [kimi-linear|k3|all]      (BUDGETS="4G 8G 16G" GEN=8 by default;
#                                                         KEEP=1 keeps the checkpoint and reuses it)
#
# kimi-linear: Kimi-Linear-48B-A3B's published config whole, its experts in MXFP4 (~25 GB + the bf16
# trunk). k3: Kimi K3's published config cut to its first 3 layers (a dense one, two MoE ones: 896
# experts of 3 x 3584 x 3072 each), ~16 GB a MoE layer. Needs ~40 GB of free disk at $LINEAGE_STREAM_DIR
# (default ~/.cache/lineage/stream-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
budgets=${BUDGETS:-"4G 8G 16G"}
gen=${GEN:-8}
dir=${LINEAGE_STREAM_DIR:-$HOME/.cache/lineage/stream-bench}
lineage=build/lineage
[ -x "$lineage" ] || { echo "build lineage first (cmake --build build)"; exit 1; }
mkdir -p "$dir"

to_bytes() { numfmt --from=iec "$1"; }

# Holds all but $1 bytes of MemAvailable in touched anonymous memory until killed (the page cache is
# left the rest); returns once it holds it.
balloon() {
  local keep; keep=$(to_bytes "$1")
  rm -f "$dir/balloon.ready"
  /usr/bin/python3 - "$keep" "$dir/balloon.ready" <<'EOF' &
import sys, time
import numpy as np
keep = int(sys.argv[1])
avail = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemAvailable:"))
n = max(0, avail - keep)
held = np.ones(n, np.uint8)  # every page written
print(f"balloon: holding {n / 2**30:.1f} GiB, {keep / 2**30:.1f} GiB left", file=sys.stderr, flush=True)
open(sys.argv[2], "w").close()
time.sleep(86400)
EOF
  balloon_pid=$!
  while [ ! -e "$dir/balloon.ready" ] && kill -0 "$balloon_pid" 2>/dev/null; do sleep 1; done
}

run() {
  local name=$1; shift
  local out="$dir/$name"
  if [ "${KEEP:-0}" = 1 ] && [ -e "$out/model.safetensors.index.json" ]; then
    echo "== $name: reusing $out (KEEP=1)"
  else
    rm -rf "$out"
    local t0; t0=$(date +%s)
    /usr/bin/python3 scripts/make-stream-checkpoint.py --out "$out" --lineage "$lineage" "$@"
    echo "== $name: written in $(( $(date +%s) - t0 )) s, $(du -sh "$out" | cut -f1)"
  fi
  "$lineage" info --model "$out" --memory-budget "${budgets%% *}" | grep -E "parameters|weights|memory plan|stream"
  for b in $budgets; do
    for cache in global per-layer; do
      echo "== $name, --memory-budget $b, --expert-cache $cache ($(date -u +%H:%M) UTC)"
      "$lineage" bench --model "$out" --memory-budget "$b" --expert-cache "$cache" --prompt 0 --gen "$gen" \
        --repetitions 1 --threads 2 || echo "(failed)"
    done
    echo "== $name, plain mmap with $b left to it ($(date -u +%H:%M) UTC)"
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    balloon "$b"
    "$lineage" bench --model "$out" --memory-budget 1T --prompt 0 --gen "$gen" --repetitions 1 --threads 2 \
      --no-roofline || echo "(failed)"
    kill "$balloon_pid" 2>/dev/null || true
    wait "$balloon_pid" 2>/dev/null || true
  done
  [ "${KEEP:-0}" = 1 ] || rm -rf "$out"
}

case "$which" in
  kimi-linear|all) run kimi-linear --config tests/data/kimi-linear-48b-a3b/config.json --mxfp4-experts ;;&
  k3|all) run k3 --config tests/data/kimi-k3/config.json --layers 3 ;;
  kimi-linear) ;;
  *) echo "usage: $0 [kimi-linear|k3|all]"; exit 2 ;;
esac
