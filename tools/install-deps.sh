#!/usr/bin/env bash
# Installs the Debian packages zoe builds against (idempotent: apt runs only when one is missing),
# and the Python packages its cross-checks use (best effort: those tests skip without them).
set -euo pipefail
pkgs=(cmake g++ make pkg-config liburing-dev libtbb-dev libopenmpi-dev openmpi-bin libgtest-dev
      libxxhash-dev nlohmann-json3-dev libcli11-dev libfmt-dev libopenblas-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "${ZOE_SKIP_PYTHON:-0}" != 1 ]; then
  python3 -m pip install -q --disable-pip-version-check safetensors numpy >/dev/null 2>&1 ||
    echo "note: pip install safetensors numpy failed; the Python cross-check tests will skip"
fi
