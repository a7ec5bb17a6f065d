#!/usr/bin/env bash
# The seeds' comparisons as trace pages (docs/trace.md, docs/study.md): rows of the lineage trained
# from scratch by `lineage study recall` on MQAR, then one MQAR sequence whose last pair repeats the
# first pair's key with another value, traced through two rows side by side:
#   OUT/softmax-vs-deltanet.html   the softmax cache growing a row a token vs DeltaNet's fixed state
#   OUT/deltanet-vs-linear.html    the repeated key: DeltaNet erases the old value, linear attention adds
# Usage: scripts/trace-comparisons.sh [OUT]   (default trace-comparisons/; about a minute on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-trace-comparisons}
bin=${LINEAGE_BIN:-build/lineage}
pairs=8
mkdir -p "$out"
"$bin" study recall --archs "softmax attention + conv,linear attention,DeltaNet" --pairs $pairs --steps 600 \
  --tokens-per-step 2048 --lr 2e-3 \
  --save-models "$out/models" | tee "$out/recall.txt"
tokens=$(cat "$out/models/repeated-key-p$pairs.tokens")
"$bin" trace --model "$out/models/softmax-attention-conv-p$pairs" --compare "$out/models/deltanet-p$pairs" \
  --tokens "$tokens" --out "$out/softmax-vs-deltanet.html"
"$bin" trace --model "$out/models/deltanet-p$pairs" --compare "$out/models/linear-attention-p$pairs" \
  --tokens "$tokens" --out "$out/deltanet-vs-linear.html"
