# Sourced by the tests/dist scripts: Open MPI's mpirun on loopback as these tests run it.
# As root Open MPI needs these; LeakSanitizer off in the sanitizer tree (Open MPI keeps its own
# allocations at exit).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
# The tests' checkpoints are tiny: split every matrix, however small (the default leaves those under
# 1 MiB whole on every rank).
export LINEAGE_TP_MIN_BYTES=0
# mpirun_for NP shm|tcp: sets the array `mpi` to the mpirun command for NP ranks over shared memory
# (vader, without its single-copy mechanism: CMA needs ptrace rights a container may lack) or TCP.
mpirun_for() {
  local btl="self,vader"
  [ "$2" = tcp ] && btl="self,tcp"
  mpi=(mpirun --oversubscribe -np "$1" --mca btl "$btl" --mca btl_vader_single_copy_mechanism none
       --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --bind-to none -x LINEAGE_TP_MIN_BYTES)
}
