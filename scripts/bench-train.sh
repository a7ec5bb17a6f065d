#!/usr/bin/env bash
# The training-speed table of docs/training.md ("Speed"): `lineage bench-train --pytorch` at batch 8 × 512 for
# GPT-2 (6 layers × 384, the default) and each delta-rule row in bench/train/ (the same shape: 6 heads of 64,
# intermediate_size 1024), lineage and PyTorch (reference/bench_train.py, Debian's torch) timed in the same run.
#   scripts/bench-train.sh [EXTRA bench-train OPTIONS]     e.g. --steps 3 --threads 2
# Uses an existing build/lineage and builds nothing. Rows print as they finish (minutes each).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/lineage ] || { echo "bench-train.sh: build/lineage not found; build it first (cmake --build build --target lineage)" >&2; exit 1; }
[ -x /usr/bin/python3 ] || { echo "bench-train.sh: --pytorch needs Debian's /usr/bin/python3 with python3-torch" >&2; exit 1; }

configs=("" bench/train/linear-attention.json bench/train/mamba2-decay.json bench/train/deltanet.json
         bench/train/gated-deltanet.json bench/train/kda.json)  # "": the default, GPT-2
printf '%-18s %12s %8s %12s %10s\n' model "lineage t/s" "% peak" "PyTorch t/s" "x PyTorch"
failed=0
for config in "${configs[@]}"; do
  if [ -z "$config" ]; then name="gpt2 6x384" args=(); else name=$(basename "$config" .json) args=(--config "$config"); fi
  if json=$(build/lineage bench-train --pytorch --json --batch 8 --seq-len 512 "${args[@]}" "$@"); then
    /usr/bin/python3 -c '
import json, sys
r = json.loads(sys.argv[2])
t, share, pt, x = (r[k] for k in ("tokens_per_s", "peak_share", "pytorch_tokens_per_s", "speedup_vs_pytorch"))
print("%-18s %12.0f %7.0f%% %12.0f %9.1fx" % (sys.argv[1], t, 100 * share, pt, x))' "$name" "$json"
  else
    printf '%-18s %12s\n' "$name" failed
    failed=1
  fi
done
exit $failed
