#!/usr/bin/env bash
# Line coverage of src/gpu under the emulated runs (the emu-labelled tests; zoe_gpu_emu is built
# with --coverage): one line per file and the total. A header counts once, at the object that
# ran most of it.   tools/cuda_emu/coverage.sh [BUILD_DIR (default build)] [--min PERCENT]
# With --min, exit 1 when the total is below PERCENT (tools/test.sh holds it to issue 43's 95 %).
# Before a measured run, delete the old counts: find BUILD/CMakeFiles/zoe_gpu_emu.dir -name '*.gcda' -delete
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
min=0
if [[ ${1:-} != --min ]]; then build=$(cd "${1:-$root/build}" && pwd); shift $(($# > 0)); else build=$root/build; fi
if [[ ${1:-} == --min ]]; then min=${2:?--min needs a percentage}; fi
dir=$build/CMakeFiles/zoe_gpu_emu.dir
[[ -d $dir ]] || { echo "coverage.sh: no $dir (a build with ZOE_CUDA_EMU)" >&2; exit 1; }
# gcov -n writes no files; the directory is for anything it would.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
for o in "$dir"/cuda_emu_src/*.o "$dir"/src/gpu/*.o; do
  [[ -f ${o%.o}.gcda ]] || continue
  src=$build/cuda_emu_src/$(basename "$o" .o)
  [[ $o == "$dir"/src/gpu/* ]] && src=$root/src/gpu/$(basename "$o" .o)
  gcov -n -o "$o" "$src" 2>/dev/null || true
done | python3 -c '
import re, sys
minimum = float(sys.argv[1])
best = {}
for name, pct, n in re.findall(r"File .(.*?).\nLines executed:([0-9.]+)% of (\d+)", sys.stdin.read()):
    if "/src/gpu/" in name:
        f = name.split("/src/gpu/")[1]
        hit = round(float(pct) * int(n) / 100)
        if f not in best or hit > best[f][0]:
            best[f] = (hit, int(n))
for f, (hit, n) in sorted(best.items()):
    print(f"{f:28s} {hit:5d} of {n:5d} lines  {100 * hit / max(n, 1):5.1f} %")
hit = sum(h for h, _ in best.values()); n = sum(n for _, n in best.values())
total = 100 * hit / max(n, 1)
print("%-28s %5d of %5d lines  %5.1f %%" % ("total", hit, n, total))
if total < minimum:
    sys.exit(f"coverage.sh: src/gpu line coverage {total:.1f} % is below {minimum:g} %: a test the emulation ran stopped covering code, or new code has none")
' "$min"
