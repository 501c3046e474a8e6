#!/usr/bin/env python3
"""Checks that the code stays readable: no function over 80 lines in any layer under src/ or in bench/, and no source
file of src/coordinator over 600 lines (tests excepted in both). Reports each one with its length and exits 1. Files over 600
lines elsewhere are known and not checked (yet).

A function is found the way this code base formats them (clang-format, no indentation inside namespaces): a line at
column 0 that ends with "{" and belongs to a signature (a "(" on it or on the three lines before it; not a namespace,
class, struct, enum or a table), up to the next line that is "}" at column 0.

Usage: tools/check_sizes.py [REPO_ROOT]
"""
import pathlib
import re
import sys

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
NOT_A_FUNCTION = re.compile(r"^(namespace|class|struct|enum|union|extern|template\s*<[^>]*>\s*(class|struct))\b")


def long_functions(lines):
    """(first line number, length, signature) of each function over MAX_FUNCTION_LINES lines."""
    found, start = [], None
    for i, line in enumerate(lines):
        if start is None:
            if (line and not line[0].isspace() and line.rstrip().endswith("{") and not line.startswith("#")
                    and "(" in "".join(lines[max(0, i - 3):i + 1]) and not NOT_A_FUNCTION.match(line)
                    and "=" not in line.split("(")[0]):
                start = i
        elif line.startswith("}"):
            length = i - start + 1
            if length > MAX_FUNCTION_LINES:
                found.append((start + 1, length, line_signature(lines, start)))
            start = None
    return found


def line_signature(lines, start):
    text = lines[start].strip()
    return text if len(text) <= 100 else text[:97] + "..."


def problems(root: pathlib.Path, folder="src", file_size_folder="src/coordinator"):
    """Functions over MAX_FUNCTION_LINES in `folder` (and its subfolders); files over MAX_FILE_LINES in
    `file_size_folder` only."""
    out = []
    for path in sorted((root / folder).rglob("*")):
        if path.suffix not in (".h", ".cc") or path.stem.endswith("_test") or "test" in path.stem.split("_"):
            continue
        lines = path.read_text(errors="replace").splitlines()
        name = path.relative_to(root)
        if path.parent == root / file_size_folder and len(lines) > MAX_FILE_LINES:
            out.append(f"{name}: {len(lines)} lines (at most {MAX_FILE_LINES}): split it by concern")
        for first, length, signature in long_functions(lines):
            out.append(f"{name}:{first}: a function of {length} lines (at most {MAX_FUNCTION_LINES}): {signature}")
    return out


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    found = problems(root) + (problems(root, folder="bench") if (root / "bench").is_dir() else [])
    for p in found:
        print(p, file=sys.stderr)
    if found:
        return 1
    print(f"sizes: src/'s and bench/'s functions <= {MAX_FUNCTION_LINES} lines, src/coordinator's files <= {MAX_FILE_LINES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
