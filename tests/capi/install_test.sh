#!/usr/bin/env bash
# The C API as a user gets it: `cmake --install` into a fresh prefix, then tests/capi/mlp_c99.c
# compiled against that prefix alone, once through pkg-config (cc -std=c99 -pedantic -Werror) and
# once through find_package(zoe), and run: one rank, then 2 ranks at stages 0 and 3, with and
# without NVMe offload. Every run checks losses and weights against its plain-C AdamW reference.
#   install_test.sh <build dir> <mpiexec>
set -euo pipefail
build=$1 mpiexec=$2
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/zoe_capi.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
test -f "$prefix/include/zoe/zoe.h" && test -f "$prefix/lib/libzoe.so" && test -f "$prefix/lib/pkgconfig/zoe.pc"
# No C++ symbol leaves the library: only the zoe_* functions are exported.
if nm -D --defined-only "$prefix/lib/libzoe.so" | awk '{print $3}' | grep -v '^zoe_' | grep -q .; then
  echo "libzoe.so exports more than zoe_*:"; nm -D --defined-only "$prefix/lib/libzoe.so" | grep -v ' zoe_' | head; exit 1
fi
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
# shellcheck disable=SC2046
cc -std=c99 -pedantic -Wall -Wextra -Werror -o "$work/mlp_pc" "$src/mlp_c99.c" $(pkg-config --cflags --libs zoe) -lm
cmake -S "$src/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
run() { echo "+ $*"; "$@"; }
run "$work/mlp_pc" 3
run "$mpiexec" --oversubscribe -np 2 "$work/mlp_pc" 0
run "$mpiexec" --oversubscribe -np 2 "$work/consumer/mlp_c99" 3
mkdir -p "$work/nvme"
run "$mpiexec" --oversubscribe -np 2 "$work/consumer/mlp_c99" 3 "$work/nvme"
run "$mpiexec" --oversubscribe -np 2 "$work/mlp_pc" 2 "$work/nvme"
echo "capi install test: 5 runs passed"
