#!/usr/bin/env bash
# The full grid of `lineage study recall` (docs/study.md): every row of the lineage trained from scratch
# on MQAR at 8 ... 256 key-value pairs, at one width, and scored on held-out sequences; the table on
# stdout, recall.json and recall.svg in OUT (default recall-grid/). PAIRS and KEYS (default 256: distinct
# keys for up to 256 pairs) narrow the grid; other options pass through, e.g.
#   PAIRS=8,16,32,64 KEYS=64 scripts/study-recall.sh --archs 'DeltaNet,linear attention'
# Uses an existing build/lineage and builds nothing. Runtime on the two-core development VM (docs/study.md):
# about 10 min for pairs 8..64; the whole grid to 256 pairs is several times that (the sequences, 4 per pair,
# grow with P, and softmax attention's cost with their square).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/lineage ] || { echo "study-recall.sh: build/lineage not found; build it first (cmake --build build --target lineage)" >&2; exit 1; }
out=${OUT:-recall-grid}
start=$(date +%s)
# 64 values; two heads of 32 at width 64, two layers; one thread per model (tiny models run faster
# without the pool's synchronization).
build/lineage study recall --pairs "${PAIRS:-8,16,32,64,128,256}" --keys "${KEYS:-256}" --values 64 --d-model 64 --heads 2 --layers 2 \
  --steps 600 --batch 32 --lr 5e-3 --threads 1 --out "$out" "$@"
echo "study-recall.sh: $(( $(date +%s) - start )) s; recall.json and recall.svg in $out/"
