#!/usr/bin/env bash
# A seed x learning-rate sweep of `lineage study recall` (docs/study.md, "Seeds and learning rates"): every
# combination of ROWS x PAIRS x SEEDS x LRS trained as its own one-thread process, JOBS at a time, on the
# grid's configuration (scripts/study-recall.sh: width 64, 2 layers, 2 heads of 32, 256 keys, 64 values, 2,048
# tokens a step). Each finished run appends one JSON line to OUT/sweep.jsonl (so a run cut short keeps what
# finished); at the end a table gives, per row, P and lr, the accuracy of every seed and their mean.
#   ROWS    ';'-separated rows, each 'ARCH[@S][+FIELD=VALUE...]': S the --decay-scale of the gated rows,
#           each +FIELD=VALUE a --set of the row's config.json (default
#           'DeltaNet;Gated DeltaNet@0.01;Gated DeltaNet@1e-6;KDA@0.01'; e.g. 'Gated DeltaNet@1e-6+use_gate=false')
#   PAIRS   comma-separated (default 16,32)        SEEDS  comma-separated (default 1,2,3,4)
#   LRS     comma-separated peak rates (default 1e-3,3e-3)
#   STEPS   default 1000    JOBS  default: every core    OUT  default recall-sweep/
#   scripts/study-recall-sweep.sh [EXTRA study recall OPTIONS]
# Uses an existing build/lineage and builds nothing. On the two-core development VM one DeltaNet run of 1,000
# steps takes about 50 s of one core (KDA 60 s, the hybrid 145 s), so the default sweep (64 runs) takes about
# half an hour there.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${LINEAGE_BIN:-build/lineage}
[ -x "$bin" ] || { echo "study-recall-sweep.sh: $bin not found; build it first (cmake --build build --target lineage)" >&2; exit 1; }
out=${OUT:-recall-sweep}
mkdir -p "$out"
: > "$out/sweep.jsonl"
IFS=';' read -r -a rows <<< "${ROWS:-DeltaNet;Gated DeltaNet@0.01;Gated DeltaNet@1e-6;KDA@0.01}"
IFS=',' read -r -a pairs <<< "${PAIRS:-16,32}"
IFS=',' read -r -a seeds <<< "${SEEDS:-1,2,3,4}"
IFS=',' read -r -a lrs <<< "${LRS:-1e-3,3e-3}"
export bin out steps=${STEPS:-1000}
export extra="$*"

# One run: its row, P, seed and lr in, one JSON line out. Runs as a child of xargs, so it reads what it
# needs from the environment.
run_one() {
  local row=$1 p=$2 seed=$3 lr=$4 arch rest scale=1 json kv
  local -a sets=()
  arch=${row%%[@+]*}
  rest=${row#"$arch"}
  if [[ $rest == @* ]]; then scale=${rest#@} scale=${scale%%+*}; fi
  if [[ $rest == *+* ]]; then
    IFS='+' read -r -a kvs <<< "${rest#*+}"
    for kv in "${kvs[@]}"; do sets+=(--set "$arch:$kv"); done
  fi
  # shellcheck disable=SC2086  # extra options split on purpose
  if json=$(OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$bin" study recall --pairs "$p" --keys 256 --values 64 \
      --d-model 64 --heads 2 --layers 2 --steps "$steps" --tokens-per-step 2048 --lr "$lr" --threads 1 \
      --archs "$arch" --decay-scale "$scale" "${sets[@]}" --seed "$seed" --json $extra); then
    local name=${row//\\/\\\\}  # the row as a JSON string: a --set value may hold quotes
    name=${name//\"/\\\"}
    printf '{"row":"%s","decay_scale":%s,"seed":%s,"lr":%s,"result":%s}\n' "$name" "$scale" "$seed" "$lr" "$json" \
      >> "$out/sweep.jsonl"
  else
    echo "study-recall-sweep.sh: run failed: $row P=$p seed=$seed lr=$lr" >&2
  fi
}
export -f run_one

start=$(date +%s)
# The combinations, seed by seed: a sweep cut short loses its last seeds, not its last rows.
for seed in "${seeds[@]}"; do for lr in "${lrs[@]}"; do for row in "${rows[@]}"; do for p in "${pairs[@]}"; do
  printf '%s\0%s\0%s\0%s\0' "$row" "$p" "$seed" "$lr"
done; done; done; done | xargs -0 -n 4 -P "${JOBS:-$(nproc)}" bash -c 'run_one "$@"' _

python3 - "$out/sweep.jsonl" <<'EOF'
import collections, json, sys
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r = json.loads(line)
    res = r["result"][0]
    runs[(r["row"], res["pairs"], r["lr"])][r["seed"]] = res["accuracy"]
seeds = sorted({s for v in runs.values() for s in v})
w = max([len("row")] + [len(row) for row, _, _ in runs])
print("%-*s %4s %7s  %s  %6s" % (w, "row", "P", "lr", " ".join("s%-4d" % s for s in seeds), "mean"))
for (row, p, lr), acc in sorted(runs.items()):
    cells = " ".join("%5.2f" % acc[s] if s in acc else "    -" for s in seeds)
    print("%-*s %4d %7g  %s  %6.2f" % (w, row, p, lr, cells, sum(acc.values()) / len(acc)))
EOF
echo "study-recall-sweep.sh: $(( $(date +%s) - start )) s; runs in $out/sweep.jsonl"
