#!/usr/bin/env bash
# The main job: install what is missing, build lineage (Release), generate text from the model lineage
# trained and ships (models/kjv-gpt2), then run `lineage tour`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLINEAGE_BUILD_TESTS=OFF >/dev/null
cmake --build build --target lineage -j "$(nproc)"
build/lineage generate --prompt "And God said" --max-tokens 60 --temperature 0.8 --top-p 0.95 --seed 1
echo
exec build/lineage tour "$@"
