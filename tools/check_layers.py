#!/usr/bin/env python3
"""Fails when a folder of src/ includes a folder its line of src/layers.txt does not list.

Each folder names the folders it may include (besides itself and the public headers,
include/zoe); anything else is a layering error, printed as file:line and the edge. CMake reads
the same table (a layer library linked outside it is a configure error), so an edge that passes
here links.
Run: tools/check_layers.py [SRC_DIR]   (ctest: layering)
"""
import pathlib
import re
import sys

def allowed_table(src):
    """src/layers.txt: folder -> the folders it may include (the one source of the table)."""
    table = {}
    for line in (src / "layers.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            folder, below = line.split(":", 1)
            table[folder.strip()] = set(below.split())
    return table


INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')


def main() -> int:
    src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent / "src")
    ALLOWED = allowed_table(src)
    errors = []
    for folder in sorted(p for p in src.iterdir() if p.is_dir()):
        allowed = ALLOWED.get(folder.name)
        if allowed is None:
            errors.append(f"{folder}: a folder the layer table (src/layers.txt) does not know")
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
