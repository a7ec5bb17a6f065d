#!/usr/bin/env bash
# Runs lineage_dist_check under Open MPI's mpirun on loopback (tests/CMakeLists.txt):
#   run.sh collectives BIN NP shm|tcp   every rank passes the collectives' checks
#   run.sh fail BIN NP                  one rank's error reaches every rank, which exit non-zero
#   run.sh die BIN NP                   a rank that dies ends the others within 60 s, not a hang
set -uo pipefail
mode=$1 bin=$2 np=$3 transport=${4:-shm}
source "$(dirname "$0")/mpirun.sh"
mpirun_for "$np" "$transport"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
case $mode in
  collectives)
    timeout 120 "${mpi[@]}" "$bin" >"$out" 2>&1
    rc=$?
    cat "$out"
    [ $rc -eq 0 ] || { echo "mpirun exited $rc"; exit 1; }
    n=$(grep -c "^dist ok: rank [0-9]* of $np over MPI" "$out")
    [ "$n" -eq "$np" ] || { echo "$n of $np ranks passed"; exit 1; } ;;
  fail)
    timeout 120 "${mpi[@]}" "$bin" --fail 1 >"$out" 2>&1
    rc=$?
    cat "$out"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "mpirun exited $rc; expected the ranks' error"; exit 1; }
    n=$(grep -c "^error: rank 1: the checkpoint's shard 3 is damaged (seen by rank" "$out")
    [ "$n" -eq "$np" ] || { echo "$n of $np ranks reported rank 1's error"; exit 1; } ;;
  die)
    start=$(date +%s)
    timeout 60 "${mpi[@]}" "$bin" --die 1 >"$out" 2>&1
    rc=$?
    cat "$out"
    [ $rc -ne 124 ] || { echo "the surviving ranks hung past 60 s"; exit 1; }
    [ $rc -ne 0 ] || { echo "mpirun exited 0 though rank 1 died"; exit 1; }
    echo "mpirun ended the job in $(( $(date +%s) - start )) s with $rc" ;;
  *) echo "usage: run.sh collectives|fail|die BIN NP [shm|tcp]"; exit 2 ;;
esac
