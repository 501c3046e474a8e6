#!/usr/bin/env python3
"""tools/check_unity_names.py on small trees: what it must report and what it must leave alone."""
import pathlib
import subprocess
import sys
import tempfile

CHECKER = pathlib.Path(__file__).resolve().parent / "check_unity_names.py"


def anonymous(namespace, body):
    return f"namespace {namespace} {{\nnamespace {{\n\n{body}\n}}  // namespace\n}}  // namespace {namespace}\n"


def run(files, batches):
    """files: {path under the source root: text}; batches: {target: [paths under src/]}, one batch each."""
    with tempfile.TemporaryDirectory() as root:
        root = pathlib.Path(root)
        build = root / "build"
        (build / "lib" / "unity").mkdir(parents=True)
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        ninja = []
        for target, included in batches.items():
            batch = build / "lib" / "unity" / f"{target}_0.cc"
            batch.write_text("".join(f'#include "{path}"\n' for path in included))
            ninja.append(f"build lib/{target}.o: CXX_COMPILER {batch}\n")
        (build / "build.ninja").write_text("".join(ninja))
        done = subprocess.run([sys.executable, str(CHECKER), str(build), str(root)], capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr


def main():
    failures = []

    def expect(name, files, batches, code, needle=""):
        rc, out = run(files, batches)
        if rc != code or needle not in out:
            failures.append(f"{name}: rc {rc} (want {code}), output {out!r}")

    two = {"t": ["lib/a.cc", "lib/b.cc"]}
    expect("the same helper name with other signatures", {
        "src/lib/a.cc": anonymous("p::lib", "int Helper(int x) {\n  return x;\n}"),
        "src/lib/b.cc": anonymous("p::lib", "double Helper(double x) {\n  return x;\n}"),
    }, two, 1, "t: p::lib::Helper is file-local in src/lib/a.cc, src/lib/b.cc")
    expect("the same type name", {
        "src/lib/a.cc": anonymous("p", "struct Case {\n  int a;\n};"),
        "src/lib/b.cc": anonymous("p", "struct Case {\n  double b;\n};"),
    }, two, 1, "p::Case")
    expect("the same constant name", {
        "src/lib/a.cc": anonymous("p", "constexpr int kRounds = 2;"),
        "src/lib/b.cc": anonymous("p", "constexpr int kRounds = 3;"),
    }, two, 1, "p::kRounds")
    expect("files of a test folder, through ../tests/", {
        "tests/e2e/a.cc": anonymous("p", "int Helper(int x) {\n  return x;\n}"),
        "tests/e2e/b.cc": anonymous("p", "int Helper(long x) {\n  return x;\n}"),
    }, {"e2e": ["../tests/e2e/a.cc", "../tests/e2e/b.cc"]}, 1, "tests/e2e/a.cc, tests/e2e/b.cc")
    expect("the same name in two namespaces", {
        "src/lib/a.cc": anonymous("p::one", "int Helper(int x) {\n  return x;\n}"),
        "src/lib/b.cc": anonymous("p::two", "int Helper(int x) {\n  return x;\n}"),
    }, two, 0)
    expect("the same alias twice", {
        "src/lib/a.cc": anonymous("p", "using json = nlohmann::json;"),
        "src/lib/b.cc": anonymous("p", "using json = nlohmann::json;"),
    }, two, 0)
    expect("public functions (the linker sees those)", {
        "src/lib/a.cc": "namespace p {\n\nint Helper(int x) {\n  return x;\n}\n\n}  // namespace p\n",
        "src/lib/b.cc": "namespace p {\n\nint Helper(long x) {\n  return x;\n}\n\n}  // namespace p\n",
    }, two, 0)
    expect("a raw string's lines", {
        "src/lib/a.cc": anonymous("p", 'const char* kSql = R"(\nCREATE TABLE jobs (\n  id INTEGER\n)";'),
        "src/lib/b.cc": anonymous("p", 'const char* kOther = R"(\nCREATE TABLE jobs (\n  id INTEGER\n)";'),
    }, two, 0)
    expect("a helper after a raw string with a delimiter", {
        "src/lib/a.cc": anonymous("p", 'const char* kSql = R"sql(\nSELECT 1\n)sql";\n\nint Helper(int x) {\n  return x;\n}'),
        "src/lib/b.cc": anonymous("p", "int Helper(long x) {\n  return x;\n}"),
    }, two, 1)
    expect("two targets may each have one", {
        "src/lib/a.cc": anonymous("p", "int Helper(int x) {\n  return x;\n}"),
        "src/lib/b.cc": anonymous("p", "int Helper(long x) {\n  return x;\n}"),
        "src/lib/c.cc": anonymous("p", "int Other() {\n  return 1;\n}"),
    }, {"t1": ["lib/a.cc", "lib/c.cc"], "t2": ["lib/b.cc", "lib/c.cc"]}, 0)

    for failure in failures:
        print(failure)
    print(f"check_unity_names: {10 - len(failures)} of 10 cases as expected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
