#!/usr/bin/env bash
# Builds llama.cpp as the reference engine of the peer benchmarks (scripts/bench-peers.sh), OUTSIDE
# the repository, once: nothing of llama.cpp is committed here.
#
#   source   ~/.cache/lineage/llama.cpp/            (a git clone, the release checked out)
#   build    ~/.cache/lineage/llama.cpp/build/      (bin/llama-quantize, bin/llama-bench,
#                                                   bin/llama-batched-bench, bin/llama-server)
#   helpers  ~/.cache/lineage/llama.cpp/build/lineage-peers/make-peer-gguf and llama-logits
#            (our own bench/peers/make_peer_gguf.cpp and tools/llama_logits.cpp, compiled against
#            that build)
#   stamp    ~/.cache/lineage/llama.cpp/build/lineage-stamp.txt
#
# Where the source comes from: the npm package node-llama-cpp@3.21.1 ships llama.cpp's release
# as a git bundle (llama/gitRelease.bundle: one squashed commit) and names the release in
# llama/llama.cpp.info.json. The machine reaches npm's registry but not GitHub, so the bundle is
# the way in: `npm pack` (no install scripts run), `git clone` the bundle, tag the release.
# node-llama-cpp applies one patch of its own at build time (llama/patches/PR-22566.diff, the model
# loader's no_alloc memory breakdown); it does not touch what llama-bench runs, and it is not
# applied here: this is llama.cpp's release as published.
#
# Idempotent: a stamp holding the package version, the release, the commit and the CMake flags
# says what was built; when it matches and the binaries exist, nothing is done. The build runs
# under `nice -n 10` with at most 2 jobs (LLAMA_CPP_JOBS to lower it), since the machine is shared.
#
# Environment: LINEAGE_CACHE (default ~/.cache/lineage); LLAMA_CPP_NATIVE (default ON:
# -DGGML_NATIVE=ON, i.e. -march=native, as fits a local reference that should use the host's
# AVX-512 as lineage does at run time; OFF: a generic x86-64 build); LLAMA_CPP_JOBS (default 2,
# capped at 2).
# Prints the paths as KEY=VALUE lines at the end (LLAMA_BENCH=..., MAKE_GGUF=...).
#
# --tests: only what the test suite needs (scripts/install-deps.sh --test calls it so): the library
# (libllama.a, ggml's), llama-quantize and tools/llama_logits.cpp against it, for tests/gguf_llama_test.cpp. A later
# run without it adds the benchmark tools to the same build tree.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
tests_only=0
case "${1:-}" in
  --tests) tests_only=1 ;;
  "") ;;
  *) echo "install-llama-cpp: error: unknown argument '$1' (--tests or nothing)" >&2; exit 2 ;;
esac

NPM_PACKAGE=node-llama-cpp
NPM_VERSION=3.21.1
cache=${LINEAGE_CACHE:-$HOME/.cache/lineage}
src=$cache/llama.cpp
build=$src/build
stamp=$build/lineage-stamp.txt
native=${LLAMA_CPP_NATIVE:-ON}
jobs=${LLAMA_CPP_JOBS:-2}
[ "$jobs" -gt 2 ] 2>/dev/null && jobs=2
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
helper_src=$repo/bench/peers/make_peer_gguf.cpp
helper=$build/lineage-peers/make-peer-gguf

log() { echo "install-llama-cpp: $*" >&2; }
die() { echo "install-llama-cpp: error: $*" >&2; exit 1; }
for tool in git cmake g++ npm tar; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' is missing (scripts/install-deps.sh installs it)"
done
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)

cmake_flags=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE="$native" -DBUILD_SHARED_LIBS=OFF
             -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
             -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_LLGUIDANCE=OFF
             -DGGML_RPC=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF)
# llama-server is built without its web page: the page is fetched from a Hugging Face bucket or built
# with npm at configure time, and the benchmarks drive only its OpenAI API.
# (LLAMA_CURL, named in older llama.cpp, no longer exists in this release: HTTPS is LLAMA_OPENSSL.)

# --- 1. the source -------------------------------------------------------------------------------
if [ ! -f "$src/.lineage-source.txt" ] ||
   ! grep -qx "package=$NPM_PACKAGE@$NPM_VERSION" "$src/.lineage-source.txt"; then
  log "fetching $NPM_PACKAGE@$NPM_VERSION from npm (for llama/gitRelease.bundle)"
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/llama.cpp-fetch.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent --ignore-scripts "$NPM_PACKAGE@$NPM_VERSION" >/dev/null) ||
    die "npm pack $NPM_PACKAGE@$NPM_VERSION failed (is the npm registry reachable?)"
  tgz=$(ls "$tmp"/*.tgz)
  tar -xzf "$tgz" -C "$tmp" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json \
    package/llama/binariesGithubRelease.json
  info=$tmp/package/llama/llama.cpp.info.json
  tag=$(sed -n 's/.*"tag"[^"]*"\([^"]*\)".*/\1/p' "$info")
  repo_name=$(sed -n 's/.*"llamaCppGithubRepo"[^"]*"\([^"]*\)".*/\1/p' "$info")
  [ -n "$tag" ] || die "no release tag in llama/llama.cpp.info.json"
  bundle=$tmp/package/llama/gitRelease.bundle
  git bundle list-heads "$bundle" >/dev/null || die "llama/gitRelease.bundle is not a git bundle"
  rm -rf "$src.new"
  git -c advice.detachedHead=false clone --quiet "$bundle" "$src.new"
  commit=$(git -C "$src.new" rev-parse HEAD)
  git -C "$src.new" -c advice.detachedHead=false checkout --quiet "$commit"
  git -C "$src.new" tag -f "$tag" "$commit" >/dev/null
  git -C "$src.new" remote remove origin
  {
    echo "package=$NPM_PACKAGE@$NPM_VERSION"
    echo "repository=$repo_name"
    echo "release=$tag"
    echo "commit=$commit"
    echo "commit_date=$(git -C "$src.new" log -1 --format=%cI)"
  } >"$src.new/.lineage-source.txt"
  rm -rf "$src"
  mv "$src.new" "$src"
  rm -rf "$tmp"
  trap - EXIT
  log "llama.cpp $tag ($repo_name, commit ${commit:0:12}) in $src"
fi
release=$(sed -n 's/^release=//p' "$src/.lineage-source.txt")
commit=$(sed -n 's/^commit=//p' "$src/.lineage-source.txt")

# --- 2. llama-bench, llama-batched-bench (batched decode of independent sequences), llama-server;
# with --tests only the library (libllama.a and ggml's), all the tests' llama-logits needs, and
# llama-quantize (the block-quantized files the GGUF tests compare on) ------------------------------
if [ "$tests_only" = 1 ]; then targets=(llama llama-quantize); else targets=(llama llama-quantize llama-bench llama-batched-bench llama-server); fi
artifact() { if [ "$1" = llama ]; then echo "$build/src/libllama.a"; else echo "$build/bin/$1"; fi; }
want_stamp=$(printf '%s\n' "package=$NPM_PACKAGE@$NPM_VERSION" "release=$release" "commit=$commit" \
  "compiler=$(g++ -dumpfullversion 2>/dev/null || g++ -dumpversion)" "cmake_flags=${cmake_flags[*]}")
have_all=1
for t in "${targets[@]}"; do [ -f "$(artifact "$t")" ] || have_all=0; done
# The stamp's first lines say what the build tree was configured for; its targets line what is in it.
if [ "$have_all" = 1 ] && [ -f "$stamp" ] && [ "$(grep -v '^build_seconds=\|^targets=' "$stamp")" = "$want_stamp" ]; then
  log "llama.cpp $release already built (${targets[*]} in $build)"
else
  log "building llama.cpp $release (${targets[*]}; GGML_NATIVE=$native, nice -n 10, -j$jobs)"
  rm -f "$stamp"
  t0=$(date +%s)
  nice -n 10 cmake -S "$src" -B "$build" "${generator[@]}" "${cmake_flags[@]}" >"$src/cmake-configure.log" 2>&1 ||
    { tail -30 "$src/cmake-configure.log" >&2; die "CMake configure failed (log: $src/cmake-configure.log)"; }
  nice -n 10 cmake --build "$build" --target "${targets[@]}" -j "$jobs" ||
    die "building ${targets[*]} failed"
  t1=$(date +%s)
  printf '%s\ntargets=%s\nbuild_seconds=%s\n' "$want_stamp" "${targets[*]}" "$((t1 - t0))" >"$stamp"
  log "${targets[*]} built in $((t1 - t0)) s ($(((t1 - t0) / 60)) min $(((t1 - t0) % 60)) s)"
fi

# --- 3. our GGUF writer, against this build's ggml -----------------------------------------------
[ -f "$helper_src" ] || die "$helper_src is missing"
if [ "$tests_only" = 1 ]; then
  :
elif [ ! -x "$helper" ] || [ "$helper_src" -nt "$helper" ] || [ "$stamp" -nt "$helper" ]; then
  base_lib=$(find "$build" -name 'libggml-base.a' | head -1)
  [ -n "$base_lib" ] || die "libggml-base.a not found under $build"
  mkdir -p "$(dirname "$helper")"
  t0=$(date +%s)
  nice -n 10 g++ -std=c++17 -O2 -fopenmp -I"$src/ggml/include" "$helper_src" "$base_lib" -lpthread -lm -o "$helper" ||
    die "compiling $helper_src failed"
  log "make-peer-gguf built in $(($(date +%s) - t0)) s"
fi

# --- 4. llama.cpp's logits of a GGUF (our tools/llama_logits.cpp, against this build's llama.h) ----
logits_src=$repo/tools/llama_logits.cpp
logits_bin=$build/lineage-peers/llama-logits
[ -f "$logits_src" ] || die "$logits_src is missing"
if [ ! -x "$logits_bin" ] || [ "$logits_src" -nt "$logits_bin" ] || [ "$stamp" -nt "$logits_bin" ]; then
  libs=()
  for lib in src/libllama.a ggml/src/libggml.a ggml/src/libggml-cpu.a ggml/src/libggml-base.a; do
    [ -f "$build/$lib" ] || die "$build/$lib not found"
    libs+=("$build/$lib")
  done
  mkdir -p "$(dirname "$logits_bin")"
  t0=$(date +%s)
  nice -n 10 g++ -std=c++17 -O2 -fopenmp -I"$src/include" -I"$src/ggml/include" "$logits_src" "${libs[@]}" \
    -lpthread -ldl -lm -o "$logits_bin" || die "compiling $logits_src failed"
  log "llama-logits built in $(($(date +%s) - t0)) s"
fi

# KEY=VALUE lines, shell-quoted (scripts/bench-peers.sh evals them).
printf 'LLAMA_CPP_RELEASE=%q\n' "$release"
printf 'LLAMA_CPP_COMMIT=%q\n' "$commit"
printf 'LLAMA_CPP_SRC=%q\n' "$src"
printf 'LLAMA_QUANTIZE=%q\n' "$build/bin/llama-quantize"
printf 'LLAMA_BENCH=%q\n' "$build/bin/llama-bench"
printf 'LLAMA_BATCHED_BENCH=%q\n' "$build/bin/llama-batched-bench"
printf 'LLAMA_SERVER=%q\n' "$build/bin/llama-server"
printf 'MAKE_GGUF=%q\n' "$helper"
printf 'LLAMA_LOGITS=%q\n' "$logits_bin"
printf 'LLAMA_CPP_BUILD_SECONDS=%q\n' "$(sed -n 's/^build_seconds=//p' "$stamp")"
