#!/usr/bin/env bash
# Fuzz campaign: builds the sanitizer + fuzz tree (build-asan, clang) if needed, then runs every
# libFuzzer harness for SECONDS (default 600), two at a time on two or more cores, printing each
# one's executions. Exits non-zero on any crash, leak, hang, huge allocation or sanitizer report;
# the input that caused it is in build-asan/fuzz/campaign/<harness>/artifacts/ (docs/testing.md).
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
scripts/install-deps.sh --fuzz
[ -f build-asan/build.ninja ] || cmake --preset asan >/dev/null
cmake --build build-asan -j "$(nproc)" --target fuzzers
parallel=$(( $(nproc) >= 2 ? 2 : 1 ))
harnesses=(fuzz_safetensors fuzz_checkpoint_index fuzz_config fuzz_tokenizer fuzz_tiktoken fuzz_npy fuzz_chat_template
           fuzz_state_file fuzz_openai_request fuzz_train_files fuzz_gguf)
echo "lineage: fuzzing ${#harnesses[@]} harnesses for ${seconds} s each, ${parallel} at a time"
# The campaign corpus (build-asan/fuzz/campaign/<harness>/corpus) grows from one campaign to the next.
if printf '%s\n' "${harnesses[@]}" |
    xargs -P "$parallel" -I{} fuzz/run.sh build-asan/fuzz/{} "$seconds" build-asan/fuzz/campaign/{}; then
  echo "lineage: fuzzing found nothing"
else
  echo "lineage: fuzzing FAILED (see above)"
  exit 1
fi
