#!/usr/bin/env python3
"""Fails when the repository's documents stop standing on their own.

- No tracked .md/.cc/.h/.cu/.py/.sh file points outside the repository to a `shared/` folder (a
  clone has none: the user's documents live in docs/).
- bench/RESULTS.md stays a table a person reads: at most 120 lines, no line over 700 characters,
  no cell over 300
  (the runs behind each figure go to bench/history.md).
Run: tools/check_docs.py [REPO_DIR]   (ctest: docs_self_contained)
"""
import pathlib
import re
import subprocess
import sys

OUTSIDE = re.compile(r"(?<![\w-])(\.\./)*shared/")


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    listed = subprocess.run(["git", "-C", str(root), "ls-files"], capture_output=True, text=True)
    if listed.returncode == 0:
        files = listed.stdout.split()
    else:  # not a git checkout (an unpacked release): every file outside build and output folders
        skip = ("build", "out", ".git")
        files = [str(p.relative_to(root)) for p in root.rglob("*")
                 if p.is_file() and not p.relative_to(root).parts[0].startswith(skip)]
    errors = []
    for name in files:
        if pathlib.Path(name).suffix not in {".md", ".cc", ".h", ".cu", ".cuh", ".py", ".sh"} or name.endswith("check_docs.py"):
            continue
        for n, line in enumerate((root / name).read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                errors.append(f"{name}:{n}: points outside the repository: {line.strip()[:100]}")
    results = (root / "bench/RESULTS.md").read_text().splitlines()
    if len(results) > 120:
        errors.append(f"bench/RESULTS.md: {len(results)} lines (at most 120; runs go to bench/history.md)")
    for n, line in enumerate(results, 1):
        if len(line) > 700:
            errors.append(f"bench/RESULTS.md:{n}: a line of {len(line)} characters (at most 700; runs go to bench/history.md)")
        for cell in line.split("|"):
            if len(cell) > 300:
                errors.append(f"bench/RESULTS.md:{n}: a cell of {len(cell)} characters (at most 300)")
    for e in errors:
        print(e)
    print(f"docs: {len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
