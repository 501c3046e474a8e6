#!/usr/bin/env python3
"""tools/check_layers.py on small trees: what it must report and what it must leave alone."""
import pathlib
import subprocess
import sys
import tempfile

CHECKER = pathlib.Path(__file__).resolve().parent / "check_layers.py"
TABLE = """## 2. Layers

| folder | owns | may use |
| --- | --- | --- |
| `src/base` | bottom | std |
| `src/loop` | loop | base |
| `src/http` | http | loop |
| `src/store` | store | base |
| `src/app` | app | http |
| `src/cli` | cli | all but store |
"""


def run(files):
    with tempfile.TemporaryDirectory() as root:
        root = pathlib.Path(root)
        (root / "docs").mkdir()
        (root / "docs" / "architecture.md").write_text(TABLE)
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
    expect("a direct dependency", {"src/http/s.cc": '#include "loop/signal.h"\n'}, 0)
    expect("through a dependency", {"src/app/a.cc": '#include "base/status.h"\n#include "loop/x.h"\n'}, 0)
    expect("its own layer and the standard library", {"src/loop/a.cc": '#include "loop/b.h"\n#include <vector>\n'}, 0)
    expect("an include upward", {"src/loop/signal.h": '#include "http/server.h"\n'}, 1,
           "src/loop/signal.h:1: loop includes http/")
    expect("a lower layer it may not use", {"src/app/a.cc": '\n#include "store/db.h"\n'}, 1, "src/app/a.cc:2")
    expect("a test may use a lower layer", {"src/app/a_test.cc": '#include "store/db.h"\n'}, 0)
    expect("a test may not use a higher one", {"src/http/h_test.cc": '#include "app/a.h"\n'}, 1, "http includes app/")
    expect("all but", {"src/cli/c.cc": '#include "app/a.h"\n#include "store/db.h"\n'}, 1, "cli includes store/")
    for f in failures:
        print(f, file=sys.stderr)
    print(f"check_layers: {8 - len(failures)}/8 cases as expected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
