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
# Found, not imported: importing torch and a framework took 1-5 s of CPU before each test (a
# module that is there but fails to import fails the test, which says why).
missing=$("$py" -c 'import importlib.util, sys
print(" ".join(m for m in sys.argv[1].split(",") if importlib.util.find_spec(m) is None))' "$needs")
if [ -n "$missing" ]; then
  echo "SKIP: $py has no ${missing// /, } (tools/install-deps.sh installs the versions zoe is tested with)"
  exit 77
fi
exec "$@"
