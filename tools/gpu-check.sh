#!/usr/bin/env bash
# The one script that checks zoe on a bare GPU machine: one that has the CUDA toolkit
# (/usr/local/cuda), a C++ compiler, CMake and PyTorch, but no package registry (no apt, no pip).
#
#   tools/gpu-check.sh --prepare            here, where Debian's registry is reachable: downloads the
#                                           .deb files of zoe's build dependencies into .gpudeps/
#                                           (and, from PyPI, cuDNN's frontend's and pybind11's headers)
#   tools/gpu-check.sh OUTDIR               on the GPU machine, with .gpudeps carried: unpacks them
#                                           into a private prefix, builds build-gpu/ (CUDA, sm_90),
#                                           runs `ctest -L gpu` and `zoe bench gpu`, and writes
#                                           OUTDIR/summary.md, OUTDIR/gpu_check.json,
#                                           OUTDIR/bench_gpu.json (when the bench ran) and
#                                           OUTDIR/gpu_check.log (every step's output)
#   tools/gpu-check.sh --build-only OUTDIR  unpack + configure + build only (no GPU needed)
#   tools/gpu-check.sh --probe DIR          the ctest check (gpudeps_probe): unpacks into DIR and
#                                           builds tests/gpudeps_probe against the prefix alone
#
# The run is bounded: each step has a timeout and the whole stays under ZOE_CHECK_TOTAL_S (440 s);
# a failed step does not stop the later independent ones, and the summary is always written. The
# exit status is 0 only when every step passed. Knobs: ZOE_JOBS (16), ZOE_CHECK_BUILD_S (240),
# ZOE_CHECK_TOTAL_S (440), ZOE_GPUDEPS_BUDGET_MIB (48), ZOE_SOURCE_COMMIT (the commit the summary
# names, where the copy's .git is not the tree's). A --build-only run on 2 cores here needs
# more time than the GPU machine's 16: ZOE_JOBS=2 ZOE_CHECK_BUILD_S=3000 ZOE_CHECK_TOTAL_S=3600.
set -uo pipefail

SCRIPT=$(readlink -f "${BASH_SOURCE[0]}")
REPO=$(dirname "$(dirname "$SCRIPT")")
DEBS=$REPO/.gpudeps            # what travels: .deb files, MANIFEST, SOURCE (about 21 MiB)
BUILD=$REPO/build-gpu
DEPS_ROOT=$BUILD/deps          # unpacked prefix: under build-gpu/, so carrying .gpudeps never
                               # carries it too (unpacked it is ~150 MiB, over the 64 MiB limit)
MULTIARCH=x86_64-linux-gnu

log() { echo "[gpu-check] $*"; }
die() { echo "gpu-check: $*" >&2; exit 1; }

# ================================ --prepare (here) ==================================================

# What zoe's CMakeLists.txt finds (pkg-config: liburing, libxxhash, openblas; find_package: TBB, MPI,
# nlohmann_json, CLI11, fmt, GTest; find_path: DLPack's header, for the C API), the OpenMPI launcher and its helpers (mpirun, orted: openmpi-bin),
# pkg-config itself (pkgconf: an image may lack it) and make (the fallback generator where ninja is
# missing). Nothing optional: no fio, clang, python or docs.
ROOTS=(libopenmpi-dev openmpi-bin libtbb-dev liburing-dev libxxhash-dev nlohmann-json3-dev libcli11-dev
       libfmt-dev libopenblas-dev libgtest-dev libdlpack-dev pkgconf make)

# The dependency walk stops at these: they are neither downloaded nor followed. Three groups:
# - BASE: in every Debian/Ubuntu base image (essential or required there), CUDA images included.
#   Shipping older copies would also shadow the machine's newer ones through LD_LIBRARY_PATH
#   (libstdc++6 from GCC 12 under a program built by GCC 13 fails to load).
PRUNE_BASE='libc6 libgcc-s1 libstdc\+\+6 gcc-[0-9]+-base zlib1g libzstd1 liblzma5 libbz2-1.0 libselinux1
  libpcre2-8-0 libudev1 libcrypt1 libacl1 libattr1 libaudit1 libaudit-common libcap-ng0 libcap2 libpam.*
  passwd adduser debconf debianutils dpkg tar perl-base libmd0 libbsd0 libtinfo6 libdb5.3 libsemanage.*
  libsepol2 libssl3 libuuid1 libcom-err2 libkeyutils1 libkrb5.* libk5crypto3 libgssapi-krb5-2 libsystemd0'
# - TOOLCHAIN: nvcc cannot work without a host compiler, so the machine has one (and its own,
#   matching C library headers); a second, older GCC would only be in the way. Fortran is not used
#   (libopenmpi-dev asks for gfortran only for the Fortran wrappers).
PRUNE_TOOLCHAIN='gcc(-[0-9]+)? g\+\+(-[0-9]+)? cpp(-[0-9]+)? gfortran(-[0-9]+)? flang-[0-9]+ binutils.*
  libc6-dev libc-dev-bin linux-libc-dev libcrypt-dev libgcc-[0-9]+-dev libstdc\+\+-[0-9]+-dev
  libgfortran-[0-9]+-dev'
# - UNNEEDED: pulled in by a -dev package but never used by zoe's build or run: the -dev packages
#   behind libopenmpi-dev (mpi.h includes none of them), GoogleTest's sources (libgtest-dev has the
#   built libraries), perl/ssh (remote launches), jquery (docs), and hwloc's plugins (optional,
#   dlopen'ed; they pull X11, libxml2 and ICU: ~12 MiB).
PRUNE_UNNEEDED='perl openssh-client googletest libhwloc-plugins libevent-dev libhwloc-dev libibverbs-dev
  libnuma-dev libpmix-dev zlib1g-dev libjs-jquery libjs-jquery-ui libltdl-dev libnl-3-dev
  libnl-route-3-dev'

prune_regex() {  # (not xargs: it would eat the backslashes of libstdc\+\+6)
  local words
  words=$(printf '%s' "$PRUNE_BASE $PRUNE_TOOLCHAIN $PRUNE_UNNEEDED" | tr -s ' \n' '  ' |
    sed -E 's/^ +| +$//g; s/ /|/g')
  echo "^($words)\$"
}

# Prints the packages to download, one a line: a breadth-first walk of Depends/Pre-Depends from ROOTS.
# Not `apt-cache depends --recurse`: that follows every alternative (gfortran | fortran-compiler
# brings flang and LLVM, hundreds of MiB) and cannot stop at the pruned packages. Here, of each
# group of alternatives the first real package is taken, and a group with a pruned member counts
# as satisfied (by the machine, or deliberately left out).
dep_closure() {
  local prune todo=("${ROOTS[@]}") next cand deps
  prune=$(prune_regex)
  for cand in libc6 libstdc++6 libgcc-s1 g++-12 libpam-modules; do  # the regex's own check
    [[ $cand =~ $prune ]] || { echo "gpu-check: the prune list does not match $cand" >&2; return 1; }
  done
  declare -A seen
  for cand in "${todo[@]}"; do seen[$cand]=1; done
  while ((${#todo[@]})); do
    deps=$(apt-cache depends --important "${todo[@]}") || return 1
    next=()
    for cand in $(awk -v prune="$prune" '
      function flush(  i) {
        if (!n) return
        for (i = 1; i <= n; i++) if (alt[i] ~ prune) { n = 0; return }
        for (i = 1; i <= n; i++) if (alt[i] !~ /^</) { print alt[i]; break }
        n = 0
      }
      /^[^ ]/ { flush(); cont = 0; next }                       # a package block starts
      /^ *\|?(Pre)?Depends:/ { if (!cont) flush(); alt[++n] = $2; cont = ($1 ~ /^\|/); next }
      /^    / { alt[++n] = $1; next }                           # providers of a virtual package
      END { flush() }' <<<"$deps"); do
      [[ -z ${seen[$cand]:-} ]] || continue
      seen[$cand]=1
      next+=("$cand")
    done
    todo=("${next[@]}")
  done
  printf '%s\n' "${!seen[@]}" | sort
}

# Fast path: nothing to do when the manifest is newer than apt's lists and this script, and every
# file it names is there.
prepare_up_to_date() {
  local m=$DEBS/MANIFEST f
  [[ -f $m && $m -nt /var/lib/apt/lists && $m -nt $SCRIPT ]] || return 1
  while read -r _ _ _ f _; do [[ -f $DEBS/$f ]] || return 1; done <"$m"
}

# The source revision the deps were prepared for, read by the run step where .git did not travel.
write_source_stamp() {
  local commit dirty=false
  commit=$(git -C "$REPO" rev-parse HEAD 2>/dev/null) || commit=unknown
  [[ -n $(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null) ]] && dirty=true
  printf 'commit %s\ndirty %s\n' "$commit" "$dirty" >"$DEBS/SOURCE"
}

prepare() {
  command -v apt-get >/dev/null || die "--prepare needs apt (Debian/Ubuntu)"
  [[ $(dpkg --print-architecture) == amd64 ]] || die "--prepare must run on amd64: the GPU machine is x86-64"
  mkdir -p "$DEBS" || die "cannot create $DEBS"
  write_source_stamp
  prepare_cudnn
  prepare_pybind11
  if prepare_up_to_date; then
    log "prepare: .gpudeps is up to date ($(du -sh "$DEBS" | cut -f1))"
    return 0
  fi
  # apt-cache knows nothing before the first `apt-get update` on a fresh machine.
  if ! apt-cache show --no-all-versions libopenmpi-dev >/dev/null 2>&1; then
    log "prepare: apt-get update"
    apt-get update -qq || die "apt-get update failed: --prepare needs the Debian registry"
  fi
  local pkgs manifest=$DEBS/MANIFEST.new
  pkgs=$(dep_closure) || die "apt-cache depends failed"
  # One line per package: name version arch file size. The run step unpacks the files it names.
  # shellcheck disable=SC2086  # one word per package
  apt-cache show --no-all-versions $pkgs | awk '
    /^Package:/ { p = $2 } /^Version:/ { v = $2 } /^Architecture:/ { a = $2 } /^Size:/ { s = $2 }
    /^$/ && p != "" { f = p "_" v "_" a ".deb"; gsub(":", "%3a", f); print p, v, a, f, s; p = "" }
    END { if (p != "") { f = p "_" v "_" a ".deb"; gsub(":", "%3a", f); print p, v, a, f, s } }' \
    >"$manifest" || die "apt-cache show failed"
  [[ $(wc -l <"$manifest") == $(wc -w <<<"$pkgs") ]] || die "apt-cache show did not describe every package"
  # Without a MANIFEST the run step and the probe know .gpudeps/ is not ready: it comes back last.
  rm -f "$DEBS/MANIFEST"
  download_missing "$manifest" || { rm -f "$manifest"; die "apt-get download failed"; }
  mv "$manifest" "$DEBS/MANIFEST"
  check_budget
}

# cuDNN's frontend headers (PyPI's wheel: tools/cudnn-frontend.sh) and cuDNN's own headers from
# this machine's toolkit (for a GPU image whose cuDNN came without them: PyTorch's wheel has the
# libraries): about 4 MiB beside the .deb files. Best effort: without them the GPU build runs
# the attention on zoe's own kernels.
prepare_cudnn() {
  "$REPO/tools/cudnn-frontend.sh" "$DEBS/cudnn-frontend" ||
    log "prepare: the cuDNN frontend's headers could not be fetched: the GPU build will have no cuDNN attention"
  if compgen -G "/usr/local/cuda/include/cudnn*.h" >/dev/null; then
    mkdir -p "$DEBS/cudnn/include" && cp -u /usr/local/cuda/include/cudnn*.h "$DEBS/cudnn/include/"
  fi
}

# pybind11's headers and CMake package (PyPI's wheel, ~1 MiB unpacked), for the Python package the
# follow-up's `python` step imports (tools/gpu-followup.sh): zoe.torch.wrap on the GPU. Debian's
# pybind11 (2.10) predates the Pythons a GPU image may have. Best effort, as the frontend's.
PYBIND11_VERSION=3.1.0
prepare_pybind11() {
  local dest=$DEBS/pybind11 tmp
  [[ $(cat "$dest/VERSION" 2>/dev/null) == "$PYBIND11_VERSION" ]] && return 0
  tmp=$(mktemp -d) || return 0
  if python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$tmp" \
       "pybind11==$PYBIND11_VERSION" &&
     python3 - "$tmp"/pybind11-*.whl "$tmp/x" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(("pybind11/include/", "pybind11/share/"))
                               or ".dist-info/licenses/" in n])
PY
  then
    rm -rf "$dest" && mkdir -p "$dest" && mv "$tmp/x/pybind11/include" "$tmp/x/pybind11/share" "$dest/" &&
      mv "$tmp"/x/*.dist-info/licenses "$dest/licenses" && echo "$PYBIND11_VERSION" >"$dest/VERSION"
  else
    log "prepare: pybind11 could not be fetched: the lease's python step will be skipped"
  fi
  rm -rf "$tmp"
}

# Downloads the packages whose file is missing (apt-get download names a file name_version_arch.deb,
# an epoch's ':' written %3a, as the manifest does), and removes .deb files it no longer names.
download_missing() {
  local manifest=$1 want=() keep=" " p v f s
  while read -r p v _ f s; do
    keep+="$f "
    [[ -f $DEBS/$f && $(stat -c %s "$DEBS/$f") == "$s" ]] || want+=("$p=$v")
  done <"$manifest"
  for f in "$DEBS"/*.deb; do
    [[ -e $f && $keep != *" $(basename "$f") "* ]] || continue
    log "prepare: stale $(basename "$f") removed"
    rm -f "$f"
  done
  ((${#want[@]})) || return 0
  log "prepare: downloading ${#want[@]} packages"
  # As root, apt hands the download to its sandbox user, who cannot write a root-owned tree.
  (cd "$DEBS" && apt-get download -q -o APT::Sandbox::User=root "${want[@]}" >/dev/null)
}

check_budget() {
  local budget=${ZOE_GPUDEPS_BUDGET_MIB:-48} bytes tree debs=("$DEBS"/*.deb)
  bytes=$(du -cb "${debs[@]}" | tail -n1 | cut -f1)
  log "prepare: ${#debs[@]} packages, $((bytes / 1048576)) MiB ($bytes bytes) in .gpudeps/ (budget $budget MiB)"
  # What travels besides: the tracked and untracked-not-ignored files.
  tree=$(git -C "$REPO" ls-files -co --exclude-standard -z 2>/dev/null |
    (cd "$REPO" && du --files0-from=- -cb 2>/dev/null) | tail -n1 | cut -f1)
  [[ -n $tree ]] && log "prepare: with the tree's other files $(((bytes + tree) / 1048576)) MiB travel (limit 64 MiB)"
  if ((bytes > budget * 1048576)); then
    die ".gpudeps/ holds $((bytes / 1048576)) MiB, over the $budget MiB budget: the travelling tree must" \
      "stay under 64 MiB. The largest: $(du -b "${debs[@]}" | sort -rn | head -3 | awk '{print $2}' | xargs -n1 basename | tr '\n' ' ')"
  fi
}

# ================================ unpacking and the environment =====================================

# Unpacks every .deb of .gpudeps/ into ROOT (never /), then fixes what the package scripts would
# have done. Skipped when ROOT already holds exactly this set (a stamp of the file list).
unpack_deps() {
  local root=$1 stamp f
  [[ -f $DEBS/MANIFEST ]] || { echo "no $DEBS/MANIFEST: run tools/gpu-check.sh --prepare here first"; return 1; }
  [[ $root == /* && $root != / ]] || { echo "refusing to unpack into '$root'"; return 1; }
  stamp=$(cat "$DEBS/MANIFEST")
  if [[ -f $root/.zoe-unpacked && $(cat "$root/.zoe-unpacked") == "$stamp" ]]; then
    echo "unpack: $root is up to date"
    return 0
  fi
  rm -rf "$root" && mkdir -p "$root" || return 1
  while read -r _ _ _ f _; do
    [[ -f $DEBS/$f ]] || { echo "missing $DEBS/$f: run tools/gpu-check.sh --prepare again"; return 1; }
    extract_deb "$DEBS/$f" "$root" || { echo "cannot unpack $f"; return 1; }
  done <"$DEBS/MANIFEST"
  fix_alternatives "$root" && fix_absolute_paths "$root" && no_runtime_shadowing "$root" || return 1
  echo "$stamp" >"$root/.zoe-unpacked"
  echo "unpack: $(wc -l <"$DEBS/MANIFEST") packages into $root ($(du -sh "$root" | cut -f1))"
}

# The prefix goes first on LD_LIBRARY_PATH: an older C or C++ runtime in it would shadow the
# machine's own, which its compiler's programs need (GLIBCXX_3.4.32 of GCC 13, say).
no_runtime_shadowing() {
  local f bad=0
  for f in libc.so.6 libm.so.6 libstdc++.so.6 libgcc_s.so.1 libz.so.1; do
    if [[ -e $1/usr/lib/$MULTIARCH/$f || -e $1/lib/$MULTIARCH/$f ]]; then
      echo "the prefix holds $f: the machine's own must not be shadowed (see PRUNE_BASE)"
      bad=1
    fi
  done
  return $bad
}

# dpkg-deb where there is one; else a .deb is an ar archive whose data.tar.* is the payload.
extract_deb() {
  local deb=$1 root=$2 member
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$deb" "$root"
    return
  fi
  member=$(ar t "$deb" | grep '^data\.tar') || return 1
  case $member in
    *.xz) ar p "$deb" "$member" | tar -xJ -C "$root" ;;
    *.zst) ar p "$deb" "$member" | tar --zstd -x -C "$root" ;;
    *.gz) ar p "$deb" "$member" | tar -xz -C "$root" ;;
    *) ar p "$deb" "$member" | tar -x -C "$root" ;;
  esac
}

# Debian points mpicc, mpirun and mpiexec at OpenMPI through update-alternatives in a maintainer
# script, which dpkg-deb -x does not run: make those links here.
fix_alternatives() {
  local bin=$1/usr/bin t
  for t in mpicc mpicxx mpic++ mpirun mpiexec; do
    [[ -e $bin/$t.openmpi ]] && { ln -sf "$t.openmpi" "$bin/$t" || return 1; }
  done
  return 0
}

# .pc files (openblas', liburing's, libxxhash's ...) and a few .cmake/.conf files name /usr
# absolutely. Rewrite /usr at the start of a path (after '=', a quote, a space, -I or -L) to
# ROOT/usr in the unpacked copies. CMake configs that compute their prefix from their own location
# stay consistent: both sides of their "/usr move" comparison are rewritten alike.
fix_absolute_paths() {
  local root=$1
  find "$root" \( -name '*.pc' -o -name '*.cmake' -o -name '*.conf' \) -type f -print0 |
    xargs -0 -r grep -lZ '/usr' |
    xargs -0 -r sed -i -E "s#(^|[=\"' (;:]|-I|-L)/usr(/|\"|'| |\$)#\\1$root/usr\\2#g"
}

# Exports what makes the unpacked prefix usable in place: binaries, libraries, pkg-config (its
# own search path only: PKG_CONFIG_LIBDIR replaces the built-in /usr one), CMake packages, and the
# variables that relocate OpenMPI (OPAL_*), its PMIx (PMIX_*: its component path is compiled in
# absolutely) and hwloc's plugin folder (the prefix has none; without this a machine with hwloc's
# plugins installed would load them from /usr).
deps_env() {
  local root=$1 lib=$1/usr/lib/$MULTIARCH pmix=$1/usr/lib/$MULTIARCH/pmix2
  export ZOE_DEPS_ROOT=$root
  export PATH=$root/usr/bin:$PATH
  export LD_LIBRARY_PATH=$lib:$root/lib/$MULTIARCH:$lib/openmpi/lib:$lib/openblas-pthread:$pmix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG=$root/usr/bin/pkgconf
  export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$root/usr/share/pkgconfig:$lib/openblas-pthread/pkgconfig
  export PKG_CONFIG_PATH=$PKG_CONFIG_LIBDIR
  export CMAKE_PREFIX_PATH=$root/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export OPAL_PREFIX=$root/usr OPAL_SYSCONFDIR=$root/etc/openmpi
  export PMIX_PREFIX=$pmix PMIX_EXEC_PREFIX=$pmix PMIX_LIBDIR=$pmix/lib PMIX_PKGLIBDIR=$pmix/lib/pmix
  export PMIX_SYSCONFDIR=$pmix/share PMIX_DATADIR=$pmix/share PMIX_PKGDATADIR=$pmix/share/pmix
  export HWLOC_PLUGINS_PATH=$lib/hwloc
  # as in tests/CMakeLists.txt's ZOE_TEST_ENV: root on an oversubscribed machine, shared memory only
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
  export OMPI_MCA_rmaps_base_oversubscribe=1
}

# The site-packages folders of the python3 that holds PyTorch, where its CUDA wheels put libraries.
site_roots() { python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null; }

# NCCL: CMakeLists.txt looks next to the CUDA toolkit (as on CI's image). A GPU image may instead
# have only the copy PyTorch's wheels bring (nvidia-nccl-*: lib/libnccl.so.2, include/nccl.h, no
# unversioned link for find_library): then it is named to CMake (nccl_cmake_args) and to the loader.
nccl_env() {
  local lib inc roots=()
  compgen -G "/usr/local/cuda/lib64/libnccl.so*" >/dev/null && [[ -f /usr/local/cuda/include/nccl.h ]] && return 0
  mapfile -t roots < <(site_roots)
  lib=$(find "${roots[@]}" /usr/lib /usr/local -name 'libnccl.so*' -path '*nccl*' 2>/dev/null | sort | head -n1)
  [[ -n $lib ]] || return 0
  inc=$(find "$(dirname "$(dirname "$lib")")" /usr/include /usr/local/include -name nccl.h 2>/dev/null | head -n1)
  [[ -n $inc ]] || inc=$(find "$REPO/.gpudeps/include" -name nccl.h 2>/dev/null | head -n1)
  export ZOE_NCCL_LIB=$lib ZOE_NCCL_INC=${inc:+$(dirname "$inc")}
  export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "nccl: $ZOE_NCCL_LIB, header in ${ZOE_NCCL_INC:-(none found)}"
}

# cuDNN (the attention's library): next to the toolkit, or PyTorch's wheel (nvidia-cudnn-*:
# lib/libcudnn.so.9, the headers beside it, or else the ones --prepare carried), and its frontend's
# headers from .gpudeps/. Its engines compile some kernels at run time: NVRTC must load too.
cudnn_env() {
  local lib inc roots=() nvrtc
  mapfile -t roots < <(site_roots)
  lib=$(find /usr/local/cuda/lib64/ "${roots[@]}" -name 'libcudnn.so.[0-9]*' 2>/dev/null | sort | head -n1)
  if [[ -z $lib ]]; then
    echo "cudnn: no libcudnn.so.9 here: the attention runs on zoe's own kernels"
    return 0
  fi
  inc=$(find "$(dirname "$(dirname "$lib")")/" /usr/local/cuda/include/ -maxdepth 2 -name cudnn.h 2>/dev/null | head -n1)
  [[ -n $inc ]] || inc=$(find "$DEBS/cudnn/include" -name cudnn.h 2>/dev/null | head -n1)
  export ZOE_CUDNN_LIB=$lib ZOE_CUDNN_INC=${inc:+$(dirname "$inc")}
  nvrtc=$(find /usr/local/cuda/lib64/ "${roots[@]}" -name 'libnvrtc.so.[0-9]*' 2>/dev/null | sort | head -n1)
  export LD_LIBRARY_PATH=$(dirname "$lib")${nvrtc:+:$(dirname "$nvrtc")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "cudnn: $ZOE_CUDNN_LIB, header in ${ZOE_CUDNN_INC:-(none found)}, nvrtc ${nvrtc:-(none found)}"
}

cudnn_cmake_args() {
  [[ -n ${ZOE_CUDNN_LIB:-} ]] && echo "-DCUDNN_LIB=$ZOE_CUDNN_LIB"
  [[ -n ${ZOE_CUDNN_INC:-} ]] && echo "-DCUDNN_INCLUDE_DIR=$ZOE_CUDNN_INC"
  [[ -f $DEBS/cudnn-frontend/include/cudnn_frontend.h ]] &&
    echo "-DCUDNN_FRONTEND_INCLUDE_DIR=$DEBS/cudnn-frontend/include"
  return 0
}

# The Python package (zoe_python) for the python3 that holds PyTorch, where pybind11 travelled and
# that python3 has its headers (CMake's ZOE_PYTHON AUTO leaves it out otherwise).
python_cmake_args() {
  [[ -f $DEBS/pybind11/share/cmake/pybind11/pybind11Config.cmake ]] || return 0
  echo "-Dpybind11_DIR=$DEBS/pybind11/share/cmake/pybind11"
  command -v python3 >/dev/null && echo "-DPython_EXECUTABLE=$(command -v python3)"
}

nccl_cmake_args() {
  [[ -n ${ZOE_NCCL_LIB:-} ]] && echo "-DNCCL_LIB=$ZOE_NCCL_LIB"
  [[ -n ${ZOE_NCCL_INC:-} ]] && echo "-DNCCL_INCLUDE_DIR=$ZOE_NCCL_INC"
  return 0
}

# CMake and ninja may be pip's, in the bin folder of the python3 that holds PyTorch, with that
# folder off PATH (python3 itself reached through a link): then that folder joins PATH.
add_python_bin() {
  local prefix
  command -v cmake >/dev/null && command -v ninja >/dev/null && return 0
  prefix=$(python3 -c 'import sys; print(sys.prefix)' 2>/dev/null) || return 0
  [[ -x $prefix/bin/cmake || -x $prefix/bin/ninja ]] && export PATH=$PATH:$prefix/bin
  return 0
}

# The CMake options that tie a configure to the prefix's pkg-config and MPI wrapper.
deps_cmake_args() {
  local root=$1
  echo "-DPKG_CONFIG_EXECUTABLE=$root/usr/bin/pkgconf -DMPI_C_COMPILER=$root/usr/bin/mpicc"
}

generator_args() {
  if command -v ninja >/dev/null; then echo "-G Ninja"; else echo "-G Unix Makefiles"; fi
}

# ================================ the steps of a run ================================================

step_preflight() {
  local ok=0 t glibc
  for t in cmake timeout; do
    command -v "$t" >/dev/null || { echo "missing: $t"; ok=1; }
  done
  command -v c++ >/dev/null || command -v g++ >/dev/null || { echo "missing: c++ (g++)"; ok=1; }
  # The .deb files are Debian 12's: their libraries need glibc 2.36 or newer (Ubuntu 24.04 has 2.39).
  glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  if [[ -n $glibc ]] && ! printf '2.36\n%s\n' "$glibc" | sort -V -C; then
    echo "glibc $glibc is older than Debian 12's 2.36: the carried libraries cannot load here"
    ok=1
  fi
  [[ -x /usr/local/cuda/bin/nvcc ]] || { echo "missing: /usr/local/cuda/bin/nvcc"; ok=1; }
  command -v dpkg-deb >/dev/null || command -v ar >/dev/null || { echo "missing: dpkg-deb or ar"; ok=1; }
  # make is among the .deb files (unpacked in the next step), ninja may be the machine's
  command -v ninja >/dev/null || command -v make >/dev/null || grep -q '^make ' "$DEBS/MANIFEST" ||
    { echo "missing: ninja or make"; ok=1; }
  cmake --version | head -n1
  { command -v c++ >/dev/null && c++ --version || g++ --version; } | head -n1
  echo "glibc ${glibc:-?}"
  /usr/local/cuda/bin/nvcc --version | tail -n2
  command -v ninja >/dev/null && echo "ninja $(ninja --version)"
  grep -h PRETTY_NAME /etc/os-release 2>/dev/null
  return $ok
}

step_unpack() { unpack_deps "$DEPS_ROOT"; }

step_configure() {
  # shellcheck disable=SC2046  # the helpers print several words on purpose
  cmake -S "$REPO" -B "$BUILD" $(generator_args) $(deps_cmake_args "$DEPS_ROOT") $(nccl_cmake_args) $(cudnn_cmake_args) $(python_cmake_args) \
    -DZOE_CUDA=ON -DZOE_CUDA_EMU=OFF -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release
}

# zoe and the gpu tests only: the rest of the suite is CI's, and building it here costs minutes.
step_build() {
  local targets=(zoe) f
  for f in "$REPO"/tests/*_gpu_test.cc; do targets+=("$(basename "$f" .cc)"); done
  # keep going past a failed file: one run on a lent machine should show every error
  local keep=-k
  command -v ninja >/dev/null && keep="-k 0"
  # shellcheck disable=SC2086
  cmake --build "$BUILD" -j "${ZOE_JOBS:-16}" --target "${targets[@]}" -- $keep
}

# The Python package, for gpu-followup's python step: a step of its own, so that a module that does
# not build here holds back nothing else.
python_configured() { grep -q '^ZOE_PYTHON_FOUND:INTERNAL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null; }
step_build_python() { cmake --build "$BUILD" -j "${ZOE_JOBS:-16}" --target zoe_python; }

cudnn_configured() { grep -q '^ZOE_CUDNN_FOUND:INTERNAL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null; }

step_build_without_cudnn() {
  cmake "$BUILD" -DZOE_CUDNN=OFF >/dev/null && step_build
}

# Where the attention test failed with cuDNN in the build, the benches (here and in
# tools/gpu-followup.sh, which reads $BUILD/attention.env) run zoe's own kernels
# (ZOE_CUDA_ATTENTION=mma), so one wrong library path does not spend the lease's figures.
attention_gate() {
  rm -f "$BUILD/attention.env"
  cudnn_configured || return 0
  grep -q 'Bf16AttentionOnTensorCores' "$BUILD/Testing/Temporary/LastTestsFailed.log" 2>/dev/null || return 0
  export ZOE_CUDA_ATTENTION=mma
  echo "export ZOE_CUDA_ATTENTION=mma" >"$BUILD/attention.env"
  ATTENTION_NOTE="the bf16 attention test failed with cuDNN in the build: the benches ran ZOE_CUDA_ATTENTION=mma"
  echo "attention: $ATTENTION_NOTE"
}

step_ctest_gpu() {
  local rc=0
  (cd "$BUILD" && ctest -L gpu --output-on-failure --no-tests=error --timeout 60) || rc=$?
  # What tests print for the record: the GPU memory outside zoe's budget ("auto" leaves 3 GiB).
  grep -h "GPU memory outside zoe's budget" "$BUILD/Testing/Temporary/LastTest.log" 2>/dev/null || true
  return $rc
}

# zoe's --json is a flag that prints the JSON on stdout (as for every bench): it goes to the file.
step_bench_gpu() {
  local out=$1 rc
  "$BUILD/zoe" bench gpu --json >"$out.tmp"
  rc=$?
  if ((rc == 0)) && json_ok "$out.tmp"; then
    mv "$out.tmp" "$out"
  else
    rm -f "$out.tmp"
    ((rc == 0)) && { echo "zoe bench gpu --json printed no valid JSON"; rc=1; }
  fi
  return $rc
}

json_ok() {
  if command -v python3 >/dev/null; then python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$1"
  else [[ $(head -c1 "$1") == [\{\[] ]]; fi
}

# ================================ running steps under a deadline ====================================

declare -a STEP_NAME=() STEP_STATUS=() STEP_SECONDS=() STEP_NOTE=()
T0=$SECONDS

# run_step NAME LIMIT FUNCTION ARGS...: runs the function in a fresh bash (this file sourced with
# --lib) under `timeout`, which ends the whole process group (make, nvcc) at the limit. Output goes
# to the log; on failure its last lines go to stdout too.
run_step() {
  local name=$1 limit=$2 fn=$3 left start rc status note="" from
  shift 3
  left=$(( ${ZOE_CHECK_TOTAL_S:-440} - (SECONDS - T0) ))
  ((limit > left)) && limit=$left
  if ((limit < 5)); then
    record_step "$name" skipped 0 "no time left under ZOE_CHECK_TOTAL_S"
    return 1
  fi
  from=$(($(stat -c %s "$LOG") + 1))
  echo "=== $name (limit ${limit} s) ===" >>"$LOG"
  start=$SECONDS
  timeout -k 10 "$limit" bash -c 'source "$0" --lib && "$@"' "$SCRIPT" "$fn" "$@" >>"$LOG" 2>&1
  rc=$?
  case $rc in
    0) status=passed ;;
    124 | 137) status=timeout; note="over ${limit} s" ;;
    *) status=failed; note="exit $rc" ;;
  esac
  note=$(refine_note "$name" "$status" "$from" "$note")
  [[ $note == missing:* ]] && status=missing note=${note#missing: }
  [[ $note == skipped:* ]] && status=skipped note=${note#skipped: }
  record_step "$name" "$status" $((SECONDS - start)) "$note"
  if [[ $status != passed ]]; then
    echo "--- last lines of $name ---"
    tail -c +"$from" "$LOG" | tail -n 30
  fi
  [[ $status == passed ]]
}

# A step's own outcome beyond its exit status: a bench zoe does not have, gpu tests that skipped.
refine_note() {
  local name=$1 status=$2 from=$3 note=$4 out skipped total
  out=$(tail -c +"$from" "$LOG")
  if [[ $name == bench_gpu && $status == failed ]] &&
     grep -qE "expected one of|not available in this build" <<<"$out"; then
    echo "missing: zoe has no 'bench gpu' yet"
    return
  fi
  if [[ $name == ctest_gpu ]]; then
    total=$(grep -oE 'tests failed out of [0-9]+' <<<"$out" | grep -oE '[0-9]+$')
    skipped=$(grep -c '\*\*\*Skipped' <<<"$out")
    if [[ $status == passed && $skipped -gt 0 ]]; then
      echo "skipped: $skipped of ${total:-?} tests skipped (no GPU seen?)"
      return
    fi
    [[ -n $total ]] && note="${note:+$note, }$total tests"
  fi
  echo "$note"
}

record_step() {
  STEP_NAME+=("$1"); STEP_STATUS+=("$2"); STEP_SECONDS+=("$3"); STEP_NOTE+=("$4")
  log "$1: $2 ($3 s)${4:+ - $4}"
}

skip_step() { record_step "$1" skipped 0 "$2"; }

# ================================ the summary =======================================================

trim() { local s=$1; s=${s#"${s%%[![:space:]]*}"}; echo "${s%"${s##*[![:space:]]}"}"; }

json_str() {  # a JSON string literal
  local s=$1
  s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\n'/\\n}; s=${s//$'\t'/\\t}; s=${s//$'\r'/}
  printf '"%s"' "$s"
}

# python3's version and headers, and the versions of torch and the frameworks zoe integrates
# with (package metadata, nothing imported): what a later session needs to carry wheels for.
python_info() {
  command -v python3 >/dev/null || { echo "no python3"; return 0; }
  timeout 20 python3 - <<'PY' 2>/dev/null || echo "$(python3 -V 2>&1) (no more could be asked)"
import os, sys, sysconfig
from importlib import metadata
def version(*names):
    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return "none"
headers = os.path.exists(os.path.join(sysconfig.get_paths().get("include", ""), "Python.h"))
print(f"{sys.version.split()[0]} ({sys.executable}, headers {'yes' if headers else 'no'}); torch {version('torch')}, "
      f"transformers {version('transformers')}, accelerate {version('accelerate')}, "
      f"lightning {version('lightning', 'pytorch-lightning')}, deepspeed {version('deepspeed')}, numpy {version('numpy')}")
PY
}

gpu_info() {  # name, driver, memory of each GPU; empty without nvidia-smi or a GPU
  command -v nvidia-smi >/dev/null || return 0
  timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
}

# "commit dirty origin": ZOE_SOURCE_COMMIT where the caller names it (a copy of the tree can carry a
# .git older than its files: the device tool sends the session's starting one), else from git
# where .git travelled, else from --prepare's stamp.
source_info() {
  local c d=false
  if [[ -n ${ZOE_SOURCE_COMMIT:-} ]]; then
    echo "$ZOE_SOURCE_COMMIT false caller"
  elif c=$(git -C "$REPO" rev-parse HEAD 2>/dev/null); then
    [[ -n $(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null) ]] && d=true
    echo "$c $d git"
  elif [[ -f $DEBS/SOURCE ]]; then
    echo "$(awk '/^commit/ {print $2}' "$DEBS/SOURCE") $(awk '/^dirty/ {print $2}' "$DEBS/SOURCE") prepare"
  else
    echo "unknown false none"
  fi
}

all_passed() {
  local s
  for s in "${STEP_STATUS[@]}"; do [[ $s == passed ]] || return 1; done
}

# GPUS (gpu_info's lines), SRC (source_info's words) and PYINFO (python_info's) are read once, by
# check().
write_json() {
  local out=$1 mode=$2 commit dirty origin i name driver mem sep=""
  read -r commit dirty origin <<<"$SRC"
  {
    printf '{\n  "mode": %s,\n  "ok": %s,\n  "total_seconds": %d,\n' "$(json_str "$mode")" \
      "$(all_passed && echo true || echo false)" $((SECONDS - T0))
    printf '  "git_commit": %s,\n  "git_dirty": %s,\n  "git_commit_from": %s,\n' \
      "$(json_str "$commit")" "$dirty" "$(json_str "$origin")"
    printf '  "host": %s,\n  "python": %s,\n  "gpus": [' "$(json_str "$(hostname 2>/dev/null || echo unknown)")" \
      "$(json_str "${PYINFO:-}")"
    while IFS=, read -r name driver mem; do
      [[ -n $name ]] || continue
      printf '%s\n    {"name": %s, "driver": %s, "memory": %s}' "$sep" "$(json_str "$(trim "$name")")" \
        "$(json_str "$(trim "$driver")")" "$(json_str "$(trim "$mem")")"
      sep=,
    done <<<"$GPUS"
    printf '%s],\n  "steps": [' "${sep:+$'\n  '}"
    sep=""
    for i in "${!STEP_NAME[@]}"; do
      printf '%s\n    {"name": %s, "status": %s, "seconds": %d, "note": %s}' "$sep" \
        "$(json_str "${STEP_NAME[$i]}")" "$(json_str "${STEP_STATUS[$i]}")" "${STEP_SECONDS[$i]}" \
        "$(json_str "${STEP_NOTE[$i]}")"
      sep=,
    done
    printf '\n  ],\n  "bench_json": %s,\n  "log": "gpu_check.log"\n}\n' \
      "$([[ -f $(dirname "$out")/bench_gpu.json ]] && echo '"bench_gpu.json"' || echo null)"
  } >"$out"
}

write_summary() {
  local out=$1 mode=$2 commit dirty origin i gpus bench
  read -r commit dirty origin <<<"$SRC"
  gpus=$(paste -sd ';' - <<<"$GPUS")
  bench=$(dirname "$out")/bench_gpu.json
  {
    echo "# zoe GPU check ($mode)"
    echo
    echo "- commit: \`$commit\`$([[ $dirty == true ]] && echo ' (with uncommitted changes)') (from $origin)"
    echo "- GPU (name, driver, memory): ${gpus:-none seen (no nvidia-smi, or it found no GPU)}"
    echo "- python: ${PYINFO:-not asked}"
    echo "- cuDNN: ${ZOE_CUDNN_LIB:-none found (the bf16 attention ran on the kernels of zoe)}$(cudnn_configured ||
      echo ' (not in the build)')${ATTENTION_NOTE:+; $ATTENTION_NOTE}"
    echo "- result: $(all_passed && echo 'every step passed' || echo 'NOT every step passed'), $((SECONDS - T0)) s in all"
    echo
    echo "| step | status | seconds | note |"
    echo "|---|---|---:|---|"
    for i in "${!STEP_NAME[@]}"; do
      echo "| ${STEP_NAME[$i]} | ${STEP_STATUS[$i]} | ${STEP_SECONDS[$i]} | ${STEP_NOTE[$i]} |"
    done
    if [[ -f $bench ]]; then
      echo
      echo "## zoe bench gpu"
      echo
      bench_table "$bench"
    fi
    said_on_the_way "$(dirname "$out")/gpu_check.log"
  } >"$out"
}

# What the build and the runs said that a next session wants without reading the log: fallbacks
# (an epilogue cuBLASLt has not or refused, an attention shape cuDNN refused), kernels that spill
# registers, the GPU memory outside zoe's budget. Each line once.
said_on_the_way() {
  [[ -f $1 ]] || return 0
  local lines
  lines=$(grep -hE "zoe: note:|runs on zoe's tensor-core kernels|ptxas (warning|info).*(spill|lmem)|GPU memory outside zoe's budget" \
    "$1" | sort -u | head -n 40)
  [[ -n $lines ]] || return 0
  echo
  echo "## Said on the way (gpu_check.log, each line once)"
  echo
  sed 's/^/    /' <<<"$lines"
}

# Any bench's JSON as Markdown: top-level scalars as a list, each array of objects as a table.
bench_table() {
  command -v python3 >/dev/null || { echo "(bench_gpu.json written; no python3 here to tabulate it)"; return; }
  python3 - "$1" <<'EOF'
import json, sys
data = json.load(open(sys.argv[1]))
def cell(v):
    if isinstance(v, float): return f"{v:.4g}"
    if isinstance(v, (dict, list)): return json.dumps(v)[:60]
    return str(v)
def walk(v, path):
    if isinstance(v, dict):
        scalars = {k: x for k, x in v.items() if not isinstance(x, (dict, list))}
        for k, x in scalars.items(): print(f"- {path + k}: {cell(x)}")
        if scalars: print()
        for k, x in v.items():
            if isinstance(x, (dict, list)): walk(x, path + k + ".")
    elif isinstance(v, list) and v and all(isinstance(r, dict) for r in v):
        cols = []
        for r in v:
            cols += [k for k in r if k not in cols]
        print(f"**{path.rstrip('.') or 'rows'}**\n")
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for r in v[:100]: print("| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |")
        print()
    elif isinstance(v, list):
        print(f"- {path.rstrip('.')}: {cell(v)}")
walk(data, "")
EOF
}

# ================================ the modes =========================================================

# The run on the GPU machine (and --build-only here): every step is recorded, the summary always
# written. The steps' limits add up to more than ZOE_CHECK_TOTAL_S, which caps the later ones.
check() {
  local mode=$1 out=$2
  mkdir -p "$out" || die "cannot create $out"
  out=$(readlink -f "$out")
  LOG=$out/gpu_check.log
  : >"$LOG" || die "cannot write $LOG"
  rm -f "$out/bench_gpu.json"
  GPUS=$(gpu_info)
  SRC=$(source_info)
  add_python_bin
  PYINFO=$(python_info)
  deps_env "$DEPS_ROOT"
  nccl_env >>"$LOG" 2>&1
  cudnn_env >>"$LOG" 2>&1
  local ok_pre=0 ok_unpack=0 ok_conf=0 ok_build=0
  run_step preflight 30 step_preflight && ok_pre=1
  run_step unpack 60 step_unpack && ok_unpack=1
  if ((ok_pre && ok_unpack)); then run_step configure 90 step_configure && ok_conf=1
  else skip_step configure "preflight or unpack failed"; fi
  if ((ok_conf)); then run_step build "${ZOE_CHECK_BUILD_S:-240}" step_build && ok_build=1
  else skip_step build "configure did not pass"; fi
  # A build that failed with cuDNN (its frontend against this machine's cuDNN) is tried once more
  # without it: the rest of the lease still checks zoe on its own kernels.
  if ((ok_conf && !ok_build)) && cudnn_configured; then
    run_step build_without_cudnn "${ZOE_CHECK_BUILD_S:-240}" step_build_without_cudnn && ok_build=1
  fi
  if [[ $mode == run ]]; then
    if ((ok_build)); then
      run_step ctest_gpu 150 step_ctest_gpu
      attention_gate >>"$LOG" 2>&1
      run_step bench_gpu 200 step_bench_gpu "$out/bench_gpu.json"
    else
      skip_step ctest_gpu "build did not pass"
      skip_step bench_gpu "build did not pass"
    fi
  fi
  # last: what the follow-up call needs, after this call's own figures
  if ((ok_build)) && python_configured; then run_step build_python 90 step_build_python; fi
  write_json "$out/gpu_check.json" "$mode" || echo "gpu-check: cannot write $out/gpu_check.json" >&2
  write_summary "$out/summary.md" "$mode" || echo "gpu-check: cannot write $out/summary.md" >&2
  log "wrote $out/summary.md, $out/gpu_check.json, $out/gpu_check.log"
  all_passed
}

# --probe DIR: the test of the unpack-and-build part without a full build (tests/CMakeLists.txt,
# gpudeps_probe). Exit 77 (ctest: skipped) when .gpudeps/ was not prepared.
probe() {
  local dir=$1
  if [[ ! -f $DEBS/MANIFEST ]]; then
    echo "SKIP: .gpudeps/ is not prepared (tools/gpu-check.sh --prepare needs Debian's registry)"
    exit 77
  fi
  mkdir -p "$dir" || die "cannot create $dir"
  dir=$(readlink -f "$dir")
  unpack_deps "$dir/deps" || die "unpack failed"
  deps_env "$dir/deps"
  probe_build "$dir" && probe_run "$dir"
}

# Configures tests/gpudeps_probe with every find confined to the prefix (CMAKE_FIND_ROOT_PATH, and
# PKG_CONFIG_LIBDIR from deps_env): its CMakeLists fails when a package resolves elsewhere. The
# compile lists its headers (-H) and the link its files (--trace): none of a dependency's may come
# from outside the prefix, where this machine has its own copies in /usr.
probe_build() {
  local dir=$1 root=$1/deps foreign
  rm -rf "$dir/build"
  # shellcheck disable=SC2046
  cmake -S "$REPO/tests/gpudeps_probe" -B "$dir/build" $(generator_args) $(deps_cmake_args "$root") \
    -DCMAKE_BUILD_TYPE=Debug -DZOE_DEPS_ROOT="$root" -DCMAKE_FIND_ROOT_PATH="$root" \
    -DCMAKE_FIND_ROOT_PATH_MODE_PACKAGE=ONLY -DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY \
    -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY -DCMAKE_FIND_ROOT_PATH_MODE_PROGRAM=NEVER \
    >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; echo "probe: configure failed"; return 1; }
  cmake --build "$dir/build" -j 2 >"$dir/build.log" 2>&1 ||
    { tail -n 40 "$dir/build.log"; echo "probe: build failed"; return 1; }
  foreign=$(dep_paths <"$dir/build.log" | grep -v "^$root/" | sort -u)
  if [[ -n $foreign ]]; then
    echo "probe: compiled or linked against a dependency's files outside $root:"
    echo "$foreign"
    return 1
  fi
  local seen lib
  seen=$(dep_paths <"$dir/build.log")
  for lib in oneapi/tbb fmt/ nlohmann/ CLI/ gtest/ xxhash.h liburing.h mpi.h cblas.h libtbb libfmt \
             libgtest libopenblas liburing libxxhash libmpi; do
    grep -q "$lib" <<<"$seen" || { echo "probe: the build log shows no $lib: -H or --trace did not work"; return 1; }
  done
  echo "probe: configured, compiled and linked against $root alone"
}

# Absolute paths in the compiler's -H and the linker's --trace output that belong to a dependency.
dep_paths() {
  grep -oE "(^|[ (])/[^ ()]+" | sed -E 's/^[ (]//' | sort -u | xargs -r -d '\n' realpath -m -- |
    grep -E '/(oneapi|tbb|fmt|nlohmann|CLI|gtest|gmock|openmpi|openblas[^/]*|pmix[^/]*|event2)/|/(xxhash\.h|xxh3\.h|liburing[^/]*|cblas\.h|mpi\.h|lib(mpi|open-pal|open-rte|pmix|hwloc|event[_a-z]*|tbb[a-z_0-9]*|fmt|openblas|blas|lapack|gtest[a-z_]*|uring|xxhash|gfortran)[-.][^/]*)$'
}

# Runs the probe as a singleton (OpenMPI starts its orted helper from OPAL_PREFIX) and under the
# prefix's mpirun with 2 ranks; each run checks /proc/self/maps itself.
probe_run() {
  local exe=$1/build/gpudeps_probe
  [[ $(command -v mpirun) == "$ZOE_DEPS_ROOT/usr/bin/mpirun" ]] || { echo "probe: mpirun is not the prefix's"; return 1; }
  timeout 60 "$exe" || { echo "probe: the singleton run failed"; return 1; }
  timeout 60 mpirun -np 2 "$exe" || { echo "probe: mpirun -np 2 failed"; return 1; }
  echo "probe: passed"
}

usage() { sed -n '2,/^set -uo/p' "$SCRIPT" | sed '$d; s/^# \{0,1\}//'; }

main() {
  case ${1:-} in
    --prepare) prepare ;;
    --build-only) [[ $# == 2 ]] || die "usage: tools/gpu-check.sh --build-only OUTDIR"; check build-only "$2" ;;
    --probe) [[ $# == 2 ]] || die "usage: tools/gpu-check.sh --probe DIR"; probe "$2" ;;
    -h | --help) usage ;;
    "") usage; exit 2 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [[ $# == 1 ]] || die "usage: tools/gpu-check.sh OUTDIR"; check run "$1" ;;
  esac
}

[[ ${1:-} == --lib ]] && return 0  # sourced by run_step: the functions only
# One line: bash has read all of it before it runs, so an edit of this file during a run is harmless.
main "$@"; exit
