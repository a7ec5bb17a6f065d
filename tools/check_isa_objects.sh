#!/usr/bin/env bash
# Usage: check_isa_objects.sh path/to/liblineage_kernels.a
#
# The files src/lineage/kernels/x86/*_avx2.cpp and *_avx512*.cpp are compiled with wider instruction
# sets than the rest of the engine, and only run after dispatch.cpp has checked the CPU. A function
# such a file emits with vague linkage (an inline function or a template instantiation: a weak symbol)
# can be the one copy the linker keeps for the whole program, portable callers included; if that copy
# uses ymm / zmm / mask registers, a CPU without them crashes in code that never chose that ISA. So
# every weak symbol of those objects must be free of them (the files keep their helpers in anonymous
# namespaces for this reason). Prints each offender and exits non-zero.
set -euo pipefail
lib=$(realpath "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
ar x "$lib"
status=0
checked=0
for o in *_avx2.cpp.o *_avx512*.cpp.o; do
  [ -e "$o" ] || continue
  checked=$((checked + 1))
  for sym in $(nm "$o" | awk '$2 == "W" {print $3}'); do
    if objdump -d --no-show-raw-insn --disassemble="$sym" "$o" | grep -qE '%[yz]mm[0-9]|%k[1-7]'; then
      echo "$o: $(echo "$sym" | c++filt) is a weak symbol and uses ymm/zmm/mask registers"
      status=1
    fi
  done
done
if [ "$checked" -eq 0 ]; then
  echo "no per-ISA objects (*_avx2.cpp.o, *_avx512*.cpp.o) in $lib"
  exit 1
fi
echo "$checked per-ISA objects checked"
exit $status
