#!/usr/bin/env bash
# The full grid of `lineage study recall` (docs/study.md): every row of the lineage trained from scratch on
# MQAR at 8 ... 256 key-value pairs, at one width, and scored on held-out sequences; the tables on stdout,
# recall.json and recall.svg in OUT/ungated and OUT/gated (default OUT: recall-grid/). PAIRS and KEYS
# (default 256: distinct keys for up to 256 pairs) narrow the grid; other options (not --archs, --lr) pass
# through, e.g.
#   PAIRS=8,16,32,64 KEYS=64 scripts/study-recall.sh --steps 1000
# Uses an existing build/lineage and builds nothing. Runtime on the two-core development VM (docs/study.md):
# about 25 min for pairs 8..64; the whole grid to 256 pairs is several times that (the sequences, 4 per
# pair, grow with P, and softmax attention's cost with their square).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/lineage ] || { echo "study-recall.sh: build/lineage not found; build it first (cmake --build build --target lineage)" >&2; exit 1; }
out=${OUT:-recall-grid}
start=$(date +%s)
# 64 values; two heads of 32 at width 64, two layers; one thread per model (tiny models run faster
# without the pool's synchronization). The rows with a decay gate train at a lower peak rate: at 5e-3
# Gated DeltaNet and KDA collapse to the uniform guess over the values (docs/study.md); at 2e-3 they learn.
common=(--pairs "${PAIRS:-8,16,32,64,128,256}" --keys "${KEYS:-256}" --values 64 --d-model 64 --heads 2 --layers 2
        --steps 600 --batch 32 --threads 1)
build/lineage study recall "${common[@]}" --archs 'softmax attention,linear attention,DeltaNet' --lr 5e-3 \
  --out "$out/ungated" "$@"
build/lineage study recall "${common[@]}" --archs 'Gated DeltaNet,KDA,KDA/MLA 3:1 hybrid' --lr 2e-3 \
  --out "$out/gated" "$@"
echo "study-recall.sh: $(( $(date +%s) - start )) s; recall.json and recall.svg in $out/ungated and $out/gated"
