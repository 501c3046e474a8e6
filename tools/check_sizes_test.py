#!/usr/bin/env python3
"""tools/check_sizes.py on small trees: what it must report and what it must leave alone."""
import pathlib
import subprocess
import sys
import tempfile

CHECKER = pathlib.Path(__file__).resolve().parent / "check_sizes.py"


def function(name, body_lines):
    """A function of body_lines + 2 lines, formatted as clang-format leaves this code base's."""
    return f"int {name}(int x) {{\n" + "  x += 1;\n" * body_lines + "}\n"


def run(files):
    with tempfile.TemporaryDirectory() as root:
        root = pathlib.Path(root)
        (root / "src").mkdir()
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        done = subprocess.run([sys.executable, str(CHECKER), str(root)], capture_output=True, text=True)
        return done.returncode, done.stderr


def main():
    failures = []

    def expect(name, files, code, needle=""):
        rc, err = run(files)
        if rc != code or needle not in err:
            failures.append(f"{name}: rc {rc} (want {code}), stderr {err!r}")

    expect("80 lines is the most", {"src/storage/a.cc": function("F", 78)}, 0)
    expect("81 lines in the coordinator", {"src/coordinator/a.cc": function("F", 79)}, 1,
           "src/coordinator/a.cc:1: a function of 81 lines")
    expect("81 lines in any other layer", {"src/storage/a.cc": "\n" + function("F", 79)}, 1,
           "src/storage/a.cc:2: a function of 81 lines")
    expect("a folder inside a layer", {"src/data/sub/a.h": function("F", 79)}, 1, "src/data/sub/a.h:1")
    expect("tests may be long", {"src/cli/a_test.cc": function("F", 79), "src/cli/test_util.cc": function("G", 79)}, 0)
    expect("a table is not a function", {"src/data/t.cc": "const Range kTable[] = {\n" + "  {1, 2},\n" * 90 + "};\n"}, 0)
    expect("a long coordinator file", {"src/coordinator/big.cc": "// x\n" * 601}, 1,
           "src/coordinator/big.cc: 601 lines")
    expect("long files elsewhere are not checked (yet)", {"src/storage/big.cc": "// x\n" * 601}, 0)
    expect("81 lines in a benchmark", {"bench/b.cc": function("main", 79)}, 1, "bench/b.cc:1: a function of 81 lines")
    for f in failures:
        print(f, file=sys.stderr)
    print(f"check_sizes: {9 - len(failures)}/9 cases as expected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
