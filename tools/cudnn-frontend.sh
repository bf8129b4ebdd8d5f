#!/usr/bin/env bash
# cuDNN's C++ frontend (NVIDIA's, header-only, MIT licence): the graph API that zoe's cuDNN
# attention is written against (src/gpu/cudnn_attention.cc). PyPI's nvidia-cudnn-frontend wheel
# carries its headers; they are unpacked into DEST/include (CMakeLists.txt looks in
# .deps/cudnn-frontend/include). Idempotent (DEST/VERSION). Best effort for a build: without them
# a CUDA build runs the attention on zoe's own kernels and says so.
#
#   tools/cudnn-frontend.sh [DEST]      DEST default .deps/cudnn-frontend
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.32.0
dest=${1:-.deps/cudnn-frontend}
if [[ -f $dest/include/cudnn_frontend.h && $(cat "$dest/VERSION" 2>/dev/null) == "$version" ]]; then exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Any of its wheels: the headers are the same in each (the wheels differ in the Python module).
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.11 \
  --implementation cp --platform manylinux_2_28_x86_64 -d "$tmp" "nvidia-cudnn-frontend==$version"
wheel=$(compgen -G "$tmp/nvidia_cudnn_frontend-$version-*.whl" | head -n1)
[[ -n $wheel ]] || { echo "cudnn-frontend: pip saved no wheel of nvidia-cudnn-frontend $version" >&2; exit 1; }
python3 - "$wheel" "$tmp/x" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    if not any(n == "include/cudnn_frontend.h" for n in names):
        sys.exit("cudnn-frontend: the wheel has no include/cudnn_frontend.h")
    licences = [n for n in z.namelist() if ".dist-info/licenses/" in n and not n.endswith("/")]
    z.extractall(sys.argv[2], names + licences)
PY
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.new"
mkdir -p "$dest.new"
mv "$tmp/x/include" "$dest.new/include"
mv "$tmp"/x/*.dist-info/licenses "$dest.new/licenses"  # its MIT licence and NOTICE travel with it
echo "$version" >"$dest.new/VERSION"
rm -rf "$dest"
mv "$dest.new" "$dest"
echo "cudnn-frontend: $version's headers in $dest/include"
