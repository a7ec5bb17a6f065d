#!/usr/bin/env bash
# Tensor parallelism through the real command (tests/CMakeLists.txt): `mpirun -np NP lineage logits`
# on each family's tiny checkpoint must write the very bytes one process writes, for a whole prefill
# and token by token, and rank 0 must report that rows were gathered (the split ran).
#   logits.sh LINEAGE NP shm|tcp TESTDATA [DIR ...]   (DIR relative to TESTDATA; "--no-mmap" after a
#                                                      DIR loads it owned, [out, in]; "--parallel
#                                                      expert" places its routed experts by rank, and
#                                                      rank 0 must report their gathers)
set -uo pipefail
lineage=$1 np=$2 transport=$3 testdata=$4
shift 4
source "$(dirname "$0")/mpirun.sh"
mpirun_for "$np" "$transport"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tokens="3 17 42 9 101 5 77 23 64 1 150 12 88"
failures=0
while [ $# -gt 0 ]; do
  dir=$1; shift
  extra=()
  while true; do
    case "${1:-}" in
      --no-mmap) extra+=(--no-mmap); shift ;;
      --parallel) extra+=(--parallel "$2"); shift 2 ;;
      *) break ;;
    esac
  done
  for chunk in 0 1; do
    args=(logits --model "$testdata/$dir" --tokens "$tokens" --threads 1 "${extra[@]}")
    [ "$chunk" -gt 0 ] && args+=(--chunk "$chunk")
    what="$dir ${extra[*]} (chunk ${chunk/#0/all})"
    if ! "$lineage" "${args[@]}" --out "$work/one.npy" 2>"$work/err"; then
      echo "FAIL $what: one process: $(cat "$work/err")"; failures=$((failures + 1)); continue
    fi
    rm -f "$work/ranks.npy"
    if ! timeout 120 "${mpi[@]}" "$lineage" "${args[@]}" --out "$work/ranks.npy" >"$work/out" 2>&1; then
      echo "FAIL $what: mpirun -np $np:"; cat "$work/out"; failures=$((failures + 1)); continue
    fi
    if ! cmp -s "$work/one.npy" "$work/ranks.npy"; then
      echo "FAIL $what: the logits of $np ranks differ from one process's"; failures=$((failures + 1)); continue
    fi
    gathers=$(sed -nE "s/^lineage: $np ranks over .*: ([0-9]+) row gathers.*/\1/p" "$work/out")
    if [ "$np" -gt 1 ] && ! [ "${gathers:-0}" -gt 0 ]; then
      echo "FAIL $what: rank 0 reported no row gathers:"; cat "$work/out"; failures=$((failures + 1)); continue
    fi
    experts=$(sed -nE "s/^lineage: $np ranks over .*row gathers \(([0-9]+) of experts placed by rank\).*/\1/p" "$work/out")
    if [ "$np" -gt 1 ] && [[ " ${extra[*]} " == *" --parallel expert "* ]] && ! [ "${experts:-0}" -gt 0 ]; then
      echo "FAIL $what: rank 0 reported no gathers of experts placed by rank:"; cat "$work/out"; failures=$((failures + 1)); continue
    fi
    echo "ok   $what: $np ranks bit for bit one process (${gathers:-no} row gathers, ${experts:-no} of experts by rank)"
  done
done
[ "$failures" -eq 0 ] || { echo "$failures failed"; exit 1; }
