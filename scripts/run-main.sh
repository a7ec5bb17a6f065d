#!/usr/bin/env bash
# The main job: install what is missing, build lineage (Release), run `lineage tour`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLINEAGE_BUILD_TESTS=OFF >/dev/null
cmake --build build --target lineage -j "$(nproc)"
exec build/lineage tour "$@"
