#!/usr/bin/env bash
# Runs one of zoe's Python tests (the command after the interpreter's path), skipping with exit
# code 77 where that interpreter has no torch (tools/install-deps.sh installs Debian's), or lacks a
# module named after --needs (comma-separated: transformers, accelerate, pytorch_lightning).
set -euo pipefail
py=$1
shift
needs=torch
if [ "${1:-}" = --needs ]; then
  needs="torch,$2"
  shift 2
fi
for m in ${needs//,/ }; do
  if ! "$py" -c "import $m" >/dev/null 2>&1; then
    echo "SKIP: $py cannot import $m (tools/install-deps.sh installs the versions zoe is tested with)"
    exit 77
  fi
done
exec "$@"
