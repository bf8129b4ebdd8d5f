#!/usr/bin/env bash
# Installs the Debian packages zoe builds against (idempotent: apt runs only when one is missing),
# and the Python packages its cross-checks use (best effort: those tests skip without them).
set -euo pipefail
pkgs=(cmake ninja-build lld g++ make pkg-config liburing-dev libtbb-dev libopenmpi-dev openmpi-bin libgtest-dev
      libxxhash-dev nlohmann-json3-dev libcli11-dev libfmt-dev libopenblas-dev libdnnl-dev
      fio clang libclang-rt-14-dev libdlpack-dev pybind11-dev python3-dev)  # fio: the referee of `zoe bench nvme`; clang: the sanitizer and fuzz build
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "${ZOE_SKIP_PYTHON:-0}" != 1 ]; then
  python3 -m pip install -q --disable-pip-version-check safetensors numpy >/dev/null 2>&1 ||
    echo "note: pip install safetensors numpy failed; the Python cross-check tests will skip"
  # The GPT-2 parity test and `zoe bench step` compare against PyTorch: Debian's CPU build
  # (no multi-GB wheel), and beside it transformers 4.40.2, a version checked to run with torch 1.13.
  if ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1 || ! /usr/bin/python3 -m pip --version >/dev/null 2>&1; then
    echo "installing: python3-torch python3-pip"
    { $SUDO apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-torch python3-pip >/dev/null; } ||
      echo "note: apt-get install python3-torch failed; the PyTorch parity test will skip"
  fi
  if /usr/bin/python3 -c 'import torch' >/dev/null 2>&1 &&
     ! /usr/bin/python3 -c 'from transformers import GPT2LMHeadModel' >/dev/null 2>&1; then
    echo "installing: transformers==4.40.2 (pip, beside Debian's torch)"
    /usr/bin/python3 -m pip install -q --disable-pip-version-check --break-system-packages 'transformers==4.40.2' \
      >/dev/null 2>&1 || echo "note: pip install transformers failed; the parity test uses its plain-torch GPT-2"
  fi
  # The frameworks zoe.integrations drives (Trainer, Accelerate, Lightning), in versions that run on
  # Debian's torch 1.13, pinned and --no-deps (their own requirements would pull a multi-GB CUDA torch);
  # their small pure-Python dependencies beside them.
  if /usr/bin/python3 -c 'import transformers' >/dev/null 2>&1 &&
     ! /usr/bin/python3 -c 'import accelerate, pytorch_lightning' >/dev/null 2>&1; then
    echo "installing: accelerate==0.32.1 pytorch-lightning==2.2.5 (pip --no-deps, beside Debian's torch)"
    { /usr/bin/python3 -m pip install -q --disable-pip-version-check --break-system-packages \
        psutil pyyaml fsspec tqdm typing_extensions packaging &&
      /usr/bin/python3 -m pip install -q --disable-pip-version-check --break-system-packages --no-deps \
        'accelerate==0.32.1' 'pytorch-lightning==2.2.5' 'lightning-utilities==0.11.2' 'torchmetrics==1.4.0'; } \
      >/dev/null 2>&1 || echo "note: pip install accelerate/pytorch-lightning failed; the framework tests will skip"
  fi
fi
# cuDNN's C++ frontend (header-only, from PyPI's wheel) for a CUDA build's cuDNN attention; best
# effort: without it that build runs the attention on zoe's own kernels.
if [ -x /usr/local/cuda/bin/nvcc ]; then
  "$(dirname "$0")/cudnn-frontend.sh" ||
    echo "note: the cuDNN frontend's headers could not be fetched; the CUDA build's attention stays on zoe's kernels"
fi
