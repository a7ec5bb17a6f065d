#!/usr/bin/env bash
# The lineage commands under mpirun as users run them (tests/CMakeLists.txt):
#   commands.sh LINEAGE TESTDATA SHIPPED_MODEL
# generate at 2 ranks prints what one process prints; bench at 2 ranks reports the gathers' share of
# a decoded token and each rank's memory; info --ranks 3 splits the weights into split + replicated bytes; a command that
# cannot run across ranks (chat) and a model that is not there each end every rank with the error
# and a non-zero exit within the timeout, not a hang; so does a rank killed mid-decode.
set -uo pipefail
lineage=$1 testdata=$2 shipped=$3
source "$(dirname "$0")/mpirun.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

gen=(generate --model "$shipped" --prompt "And God said" --max-tokens 12 --temperature 0.8 --seed 7 --threads 1)
"$lineage" "${gen[@]}" >"$work/one.txt" 2>/dev/null || fail "generate, one process"
mpirun_for 2 shm
timeout 120 "${mpi[@]}" "$lineage" "${gen[@]}" >"$work/two.txt" 2>"$work/err" || { fail "generate at 2 ranks"; cat "$work/err"; }
if cmp -s "$work/one.txt" "$work/two.txt" && [ -s "$work/one.txt" ]; then echo "ok   generate: 2 ranks print what one process prints"
else fail "generate: 2 ranks printed '$(cat "$work/two.txt")', one process '$(cat "$work/one.txt")'"; fi

timeout 120 "${mpi[@]}" "$lineage" bench --model "$testdata/kimi_linear/f32" --threads 1 --prompt 0 --gen 8 --repetitions 1 \
  >"$work/bench.txt" 2>&1 || fail "bench at 2 ranks"
if grep -qE "^  tg8 at depth 0, batch 1: [0-9.]+ ms = [0-9.]+ ms compute \+ [0-9.]+ ms in [1-9][0-9.]* gathers" "$work/bench.txt"; then
  echo "ok   bench: $(grep "^  tg8" "$work/bench.txt")"
else fail "bench at 2 ranks reported no gathers:"; cat "$work/bench.txt"; fi

# Each rank's memory, measured: its peak RSS and its resident pages of the mapped checkpoint, next to
# the share info --ranks predicts.
timeout 120 "${mpi[@]}" "$lineage" bench --model "$testdata/kimi_linear/f32" --threads 1 --prompt 0 --gen 4 --repetitions 1 \
  --no-roofline --json >"$work/bench.json" 2>"$work/err" || { fail "bench --json at 2 ranks"; cat "$work/err"; }
"$lineage" info --model "$testdata/kimi_linear/f32" --ranks 2 --json >"$work/info2.json" || fail "info --ranks 2"
if /usr/bin/python3 - "$work/bench.json" "$work/info2.json" "$testdata/kimi_linear/f32" <<'PY'
import json, pathlib, sys
m = json.load(open(sys.argv[1]))[0]["memory"]["ranks"]
info = json.load(open(sys.argv[2]))["ranks"]
files = sum(p.stat().st_size for p in pathlib.Path(sys.argv[3]).glob("*.safetensors"))
assert m["ranks"] == 2 and [r["rank"] for r in m["per_rank"]] == [0, 1], m
assert abs(m["weight_bytes_per_rank"] - info["weight_bytes_per_rank"]) <= 1, (m, info)
for r in m["per_rank"]:
    assert r["rss_peak_bytes"] > r["mapped_resident_bytes"] > 0, r
    assert r["mapped_resident_bytes"] <= files + 8192, (r, files)
    # each rank unmapped whole pages of the rows it never reads: it maps only its slice
    assert 0 < r["released_bytes"] < files and r["released_bytes"] % 4096 == 0, r
PY
then echo "ok   bench --json at 2 ranks: each rank's peak RSS, mapped weights resident and other ranks' rows unmapped, next to info --ranks 2"
else fail "bench --json at 2 ranks: $(head -c 600 "$work/bench.json")"; fi

# The recurrent states live where their heads live: a rank holds its share of the KDA layers' S.
"$lineage" bench --model "$testdata/kimi_linear/f32" --threads 1 --prompt 0 --gen 4 --repetitions 1 --no-roofline \
  --json >"$work/bench1.json" 2>"$work/err" || { fail "bench --json, one process"; cat "$work/err"; }
if /usr/bin/python3 - "$work/bench1.json" "$work/bench.json" <<'PY'
import json, sys
one, two = (json.load(open(f))[0]["memory"]["state_bytes"] for f in sys.argv[1:])
assert 0 < two < one, (one, two)
print(f"state a sequence: {one} bytes in one process, {two} a rank at 2 ranks")
PY
then echo "ok   the delta-rule states split by heads: a rank holds less state than one process"
else fail "the state at 2 ranks is not smaller than one process's"; fi
timeout 120 "${mpi[@]}" "$lineage" logits --model "$testdata/kimi_linear/f32" --tokens "1 2" --out "$work/x.npy" \
  --state-out "$work/s.bin" >"$work/state.txt" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "--state-out .*s.bin: state files are read and written by one process" "$work/state.txt"
then echo "ok   --state-out at 2 ranks: refused, naming the file"
else fail "--state-out at 2 ranks: exit $rc"; cat "$work/state.txt"; fi

"$lineage" info --model "$testdata/kimi_linear/f32" --ranks 3 --json >"$work/info.json" || fail "info --ranks 3"
if /usr/bin/python3 - "$work/info.json" <<'PY'
import json, math, sys
j = json.load(open(sys.argv[1]))
r, total = j["ranks"], sum(j["weight_bytes_by_dtype"].values())
assert r["ranks"] == 3 and r["split_bytes"] > 0.5 * total, r
assert r["split_bytes"] + r["replicated_bytes"] == total, (r, total)
assert r["weight_bytes_per_rank"] == r["replicated_bytes"] + math.ceil(r["split_bytes"] / 3), r
PY
then echo "ok   info --ranks 3: split + replicated = the weights, a rank holds a third of the split"
else fail "info --ranks 3: $(cat "$work/info.json" | head -c 400)"; fi
# By default matrices under 1 MiB stay whole on every rank: all of this checkpoint's.
env -u LINEAGE_TP_MIN_BYTES "$lineage" info --model "$testdata/kimi_linear/f32" --ranks 3 --json >"$work/info.json" || fail "info --ranks 3"
if /usr/bin/python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["ranks"]; assert r["split_bytes"] == 0, r' "$work/info.json"
then echo "ok   info --ranks 3 at the default LINEAGE_TP_MIN_BYTES: this tiny checkpoint's matrices stay whole"
else fail "info --ranks 3 with the default threshold split matrices under 1 MiB"; fi

start=$(date +%s)
timeout 120 "${mpi[@]}" "$lineage" chat --model "$shipped" </dev/null >"$work/chat.txt" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q '"chat" runs on one rank; under mpirun with 2 ranks these run: generate, logits' "$work/chat.txt"
then echo "ok   chat at 2 ranks: refused by name, exit $rc in $(( $(date +%s) - start )) s"
else fail "chat at 2 ranks: exit $rc"; cat "$work/chat.txt"; fi

start=$(date +%s)
mpirun_for 3 shm
timeout 120 "${mpi[@]}" "$lineage" logits --model "$work/no-such-model" --tokens "1 2 3" --out "$work/x.npy" >"$work/missing.txt" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "lineage: error (rank [0-2] of 3): .*no-such-model" "$work/missing.txt"
then echo "ok   a missing model at 3 ranks: named, exit $rc in $(( $(date +%s) - start )) s"
else fail "a missing model at 3 ranks: exit $rc"; cat "$work/missing.txt"; fi
# A rank killed mid-decode (SIGKILL to rank 1's process, found by its OMPI_COMM_WORLD_RANK) ends the job
# within 60 s with a non-zero exit: the surviving rank is not left waiting in a gather.
mpirun_for 2 shm
start=$(date +%s)
timeout 60 "${mpi[@]}" "$lineage" bench --model "$testdata/kimi_linear/f32" --threads 1 --prompt 0 --gen 1000000 \
  --repetitions 1 --no-roofline >"$work/killed.txt" 2>&1 &
job=$!
victim=""
for _ in $(seq 100); do
  sleep 0.1
  for pid in $(pgrep -f -- "--gen 1000000" || true); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then victim=$pid; fi
  done
  [ -n "$victim" ] && break
done
sleep 1  # into the decode loop's gathers
[ -n "$victim" ] && kill -9 "$victim"
wait "$job"
rc=$?
if [ -n "$victim" ] && [ $rc -ne 0 ] && [ $rc -ne 124 ]
then echo "ok   rank 1 killed mid-decode: the job ended with $rc in $(( $(date +%s) - start )) s"
else fail "rank 1 killed mid-decode (pid '${victim}'): exit $rc"; cat "$work/killed.txt"; fi
[ "$failures" -eq 0 ] || { echo "$failures failed"; exit 1; }
