#!/usr/bin/env bash
# DeepSpeed for a machine with no package registry (the GPU machine: CUDA, a compiler, PyTorch, no
# pip index, no apt), carried beside .gpudeps/ and installed there offline, for the peer runs of
# bench/deepspeed_peer.sh (issue 48: zoe against ZeRO-Infinity on the same GPU).
#
#   tools/deepspeed-wheelhouse.sh --prepare   here: .gpudeps/deepspeed/ gets DeepSpeed's sdist, the
#                                            wheels of its dependencies (binary ones for CPython
#                                            3.10-3.13), and Debian's libaio .debs (its NVMe op)
#   tools/deepspeed-wheelhouse.sh --install PREFIX
#                                            there (or here): DeepSpeed and its dependencies from
#                                            the folder alone into PREFIX/site, for the python3
#                                            that holds PyTorch (ZOE_TORCH_PYTHON), libaio unpacked
#                                            under PREFIX/aio, the environment in PREFIX/ds_env.sh
#
# DeepSpeed builds its C++/CUDA ops when first used (DS_BUILD_OPS=0, ninja from the wheels, the
# machine's nvcc); its NVMe op finds libaio through CPATH, LIBRARY_PATH and LD_LIBRARY_PATH, which
# `--install` writes to PREFIX/ds_env.sh. PyTorch itself never travels (the machine has its own).
set -euo pipefail

REPO=$(dirname "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")")
DIR=$REPO/.gpudeps/deepspeed
DEEPSPEED=${ZOE_DEEPSPEED_VERSION:-0.19.8}
PYTHONS=(3.10 3.11 3.12 3.13 3.14)
# requirements/requirements.txt of that sdist, less torch and numpy (the machine's, which
# bench/deepspeed_peer.sh checks: PyTorch's wheels do not require numpy, its images bring it),
# with nvidia-ml-py (added on CUDA machines) and what pydantic needs; pydantic-core pinned to the
# one release the downloaded pydantic accepts (any other fails its import).
PURE=(einops hjson packaging py-cpuinfo "pydantic>=2" annotated-types typing-extensions typing-inspection
      tqdm nvidia-ml-py ninja wheel)
BINARY=(msgpack psutil)

die() { echo "deepspeed-wheelhouse: $*" >&2; exit 1; }

# "pydantic-core==X" as the pydantic wheel in $DIR requires it (its METADATA's Requires-Dist).
pydantic_core_pin() {
  local whl
  whl=$(ls "$DIR"/pydantic-[0-9]*.whl 2>/dev/null | sort -V | tail -n1)
  [[ -n $whl ]] || return 1
  python3 - "$whl" <<'PY'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
for line in z.read(meta).decode().splitlines():
    m = re.match(r"Requires-Dist: pydantic[-_]core\s*\(?==\s*([0-9][^;,) ]*)", line)
    if m:
        print(f"pydantic-core=={m.group(1)}")
        sys.exit(0)
sys.exit(1)
PY
}

prepare() {
  local py=${ZOE_PREPARE_PYTHON:-python3} v
  "$py" -m pip --version >/dev/null 2>&1 || die "$py has no pip (set ZOE_PREPARE_PYTHON)"
  mkdir -p "$DIR"
  "$py" -m pip download -q --no-deps --no-binary :all: -d "$DIR" "deepspeed==$DEEPSPEED"
  "$py" -m pip download -q --only-binary :all: --python-version 3.10 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$DIR" "${PURE[@]}" setuptools
  local core
  core=$(pydantic_core_pin) || die "cannot read which pydantic-core the downloaded pydantic requires"
  for v in "${PYTHONS[@]}"; do
    "$py" -m pip download -q --only-binary :all: --no-deps --python-version "$v" \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
      -d "$DIR" "${BINARY[@]}" "$core"
  done
  (cd "$DIR" && apt-get download -q -o APT::Sandbox::User=root libaio-dev libaio1 >/dev/null)
  ls "$DIR" >"$DIR/MANIFEST.tmp" && mv "$DIR/MANIFEST.tmp" "$DIR/MANIFEST"
  echo "deepspeed-wheelhouse: $(wc -l <"$DIR/MANIFEST") files, $(du -sh "$DIR" | cut -f1) in $DIR"
}

install() {
  local prefix=$1 py=${ZOE_TORCH_PYTHON:-python3} d site
  [[ -f $DIR/MANIFEST ]] || die "$DIR is not prepared (tools/deepspeed-wheelhouse.sh --prepare, where PyPI is reachable)"
  "$py" -c 'import torch' 2>/dev/null || die "$py has no PyTorch (set ZOE_TORCH_PYTHON)"
  py=$(command -v "$py")
  mkdir -p "$prefix/aio" "$prefix/site"
  prefix=$(readlink -f "$prefix")
  site=$prefix/site
  for d in "$DIR"/libaio*.deb; do dpkg-deb -x "$d" "$prefix/aio"; done
  local lib=$prefix/aio/usr/lib/x86_64-linux-gnu
  local so=("$lib"/libaio.so.1*)
  [[ -e $lib/libaio.so ]] || ln -sf "$(basename "${so[0]}")" "$lib/libaio.so"
  # A folder on PYTHONPATH, not a venv: a venv over a python that is itself a venv would not see
  # that venv's torch. PyTorch (and numpy) stay the machine's. The async I/O op links -lcuda: the
  # toolkit's stub is enough to link (its soname loads the driver's libcuda.so.1 at run time), so
  # it is on LIBRARY_PATH only, never LD_LIBRARY_PATH. Put in its place once everything is
  # installed: a cut-short install is retried, not taken for done.
  cat >"$prefix/ds_env.sh.tmp" <<EOF
export ZOE_DS_PYTHON="$py"
export PYTHONPATH="$site\${PYTHONPATH:+:\$PYTHONPATH}"
export PATH="$site/bin:\$PATH"
export CPATH="$prefix/aio/usr/include\${CPATH:+:\$CPATH}"
export LIBRARY_PATH="$lib:/usr/local/cuda/lib64/stubs\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export CFLAGS="-I$prefix/aio/usr/include" LDFLAGS="-L$lib"
export DS_BUILD_OPS=0
export CC="\${CC:-gcc}" CXX="\${CXX:-g++}"
EOF
  # shellcheck disable=SC1091
  source "$prefix/ds_env.sh.tmp"
  local pip=("$py" -m pip install -q --no-index --find-links "$DIR" --target "$site" --no-deps)
  # Each dependency by name (--no-deps: torch and numpy are the machine's, never resolved here),
  # then DeepSpeed itself, built without isolation (its setup imports that torch) by wheel.
  "${pip[@]}" "${PURE[@]}" "${BINARY[@]}" pydantic-core
  "$py" -c 'import setuptools' 2>/dev/null || "${pip[@]}" setuptools
  "${pip[@]}" --no-build-isolation "deepspeed==$DEEPSPEED"
  "$py" -c 'import deepspeed; print("deepspeed", deepspeed.__version__)'
  mv "$prefix/ds_env.sh.tmp" "$prefix/ds_env.sh"
  echo "deepspeed-wheelhouse: installed in $site; source $prefix/ds_env.sh, then \$ZOE_DS_PYTHON runs it"
}

case ${1:-} in
  --prepare) prepare ;;
  --install) [[ -n ${2:-} ]] || die "usage: $0 --install PREFIX"; install "$2" ;;
  *) die "usage: $0 --prepare | --install PREFIX" ;;
esac
