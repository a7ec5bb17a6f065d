#!/usr/bin/env bash
# The whole test suite: install what is missing, build everything, run ctest (the reference
# fixtures generate the PyTorch goldens and the js-tiktoken token ids first).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLINEAGE_BUILD_TESTS=ON >/dev/null
cmake --build build -j "$(nproc)"
cd build
exec ctest --output-on-failure -j "$(nproc)" --timeout 900
