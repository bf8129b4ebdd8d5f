#!/usr/bin/env python3
"""Fails when a folder of src/ includes a folder above it in the layer order of docs/DESIGN.md.

Each folder names the folders it may include (besides itself and the public headers,
include/zoe); anything else is a layering error, printed as file:line and the edge. The same
table drives the CMake libraries (one per folder), so an edge that passes here links.
Run: tools/check_layers.py [SRC_DIR]   (ctest: layering)
"""
import pathlib
import re
import sys

# Top to bottom. A folder may include the folders listed for it, and nothing above them.
ALLOWED = {
    "cli": {"train", "capi", "sched", "model", "data", "ckpt", "gpu", "cpu", "nvme", "comm", "kernels", "common"},
    "capi": {"train", "sched", "model", "data", "ckpt", "nvme", "comm", "kernels", "common"},
    "train": {"sched", "model", "data", "ckpt", "gpu", "cpu", "nvme", "comm", "kernels", "common"},
    "gpu": {"model", "comm", "kernels", "common"},
    "cpu": {"model", "comm", "kernels", "common"},
    "model": {"ckpt", "comm", "kernels", "common"},
    "data": {"common"},
    "sched": {"nvme", "comm", "kernels", "common"},
    "ckpt": {"comm", "common"},
    "nvme": {"common"},
    "comm": {"kernels", "common"},
    "kernels": {"common"},
    "common": set(),
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')


def main() -> int:
    src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent / "src")
    errors = []
    for folder in sorted(p for p in src.iterdir() if p.is_dir()):
        allowed = ALLOWED.get(folder.name)
        if allowed is None:
            errors.append(f"{folder}: a folder the layer table (tools/check_layers.py) does not know")
            continue
        for f in sorted(folder.rglob("*")):
            if f.suffix not in {".h", ".cc", ".cu", ".cuh"}:
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if m and m.group(1) not in allowed | {folder.name, "zoe"}:
                    errors.append(f"{f}:{n}: {folder.name} includes {m.group(1)}/ (above it, or not below it)")
    for e in errors:
        print(e)
    print(f"layering: {len(errors)} violation(s) in {src}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
