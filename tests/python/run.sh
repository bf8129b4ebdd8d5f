#!/usr/bin/env bash
# Runs one of zoe's Python tests (the command after the interpreter's path), skipping with exit
# code 77 where that interpreter has no torch (tools/install-deps.sh installs Debian's).
set -euo pipefail
py=$1
shift
if ! "$py" -c 'import torch' >/dev/null 2>&1; then
  echo "SKIP: $py cannot import torch (Debian's python3-torch; tools/install-deps.sh installs it)"
  exit 77
fi
exec "$@"
