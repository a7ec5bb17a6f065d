#!/usr/bin/env bash
# The full grid of `lineage study recall` (docs/study.md): every row of the lineage trained from scratch on
# MQAR at 8 ... 256 key-value pairs, at one width, with the same tokens per step at every P, and scored on
# held-out sequences; the table on stdout, recall.json and recall.svg in OUT (default recall-grid/). PAIRS,
# KEYS (default 256: distinct keys for up to 256 pairs), STEPS and ARCHS narrow it; other options pass
# through, e.g.
#   PAIRS=8,16,32 ARCHS='DeltaNet,linear attention + conv' scripts/study-recall.sh --seed 3
# Uses an existing build/lineage and builds nothing. Runtime on the two-core development VM, one core:
# about 45 min for the whole grid (docs/study.md gives the measured time).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/lineage ] || { echo "study-recall.sh: build/lineage not found; build it first (cmake --build build --target lineage)" >&2; exit 1; }
out=${OUT:-recall-grid}
start=$(date +%s)
# 64 values; two heads of 32 at width 64, two layers; 2048 tokens a step (64 sequences at 8 pairs, 2 at
# 256); one peak rate for every row; one thread per model (tiny models run faster without the pool's
# synchronization).
archs=${ARCHS:-softmax attention,softmax attention + conv,linear attention,linear attention + conv,DeltaNet,Gated DeltaNet,KDA,KDA/MLA 3:1 hybrid,Qwen3.5 hybrid}
build/lineage study recall --pairs "${PAIRS:-8,16,32,64,128,256}" --keys "${KEYS:-256}" --values 64 --d-model 64 \
  --heads 2 --layers 2 --steps "${STEPS:-1000}" --tokens-per-step 2048 --lr 2e-3 --threads 1 --archs "$archs" \
  --out "$out" "$@"
echo "study-recall.sh: $(( $(date +%s) - start )) s; recall.json and recall.svg in $out"
