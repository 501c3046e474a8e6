#!/usr/bin/env python3
"""Checks that each layer under src/ includes only the layers docs/architecture.md says it may use.

The "Layers" table of docs/architecture.md is the rule: its "may use" column names each layer's direct dependencies
("all but X" for the CLI); a layer's code may include those and, through them, everything they may use. A layer's
tests (`*_test.cc`) may also include any layer lower in the table, for their fixtures (a worker test uploads to a
real S3 store), never one above. Any other `#include "<layer>/..."` is reported with its file and line, and the
exit status is 1.

Usage: tools/check_layers.py [REPO_ROOT]
"""
import pathlib
import re
import sys

ROW = re.compile(r"^\| `src/(\w+)` \|.*\| ([^|]*) \|\s*$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"(\w+)/')


def read_rules(architecture: str):
    """The layers in table order and each one's direct dependencies (layer names only)."""
    order, direct = [], {}
    for line in architecture.splitlines():
        m = ROW.match(line)
        if m:
            order.append(m.group(1))
            direct[m.group(1)] = m.group(2).strip()
    if not order:
        raise SystemExit("docs/architecture.md has no layer table (rows | `src/<layer>` | ... | may use |)")
    rules = {}
    for layer in order:
        text = direct[layer]
        if text.startswith("all but "):
            excluded = {w.strip() for w in text[len("all but "):].split(",")}
            rules[layer] = {l for l in order if l != layer and l not in excluded}
        else:
            rules[layer] = {w.strip() for w in text.split(",") if w.strip() in direct}
    return order, rules


def closure(rules):
    """Each layer's transitive dependencies."""
    allowed = {}
    def visit(layer, seen):
        for dep in rules[layer]:
            if dep not in seen:
                seen.add(dep)
                visit(dep, seen)
        return seen
    for layer in rules:
        allowed[layer] = visit(layer, set())
    return allowed


def violations(root: pathlib.Path, order, allowed):
    found = []
    for layer, code_deps in allowed.items():
        folder = root / "src" / layer
        lower = set(order[:order.index(layer)])
        for path in sorted(folder.rglob("*")):
            if path.suffix not in (".h", ".cc"):
                continue
            deps = code_deps | lower if path.name.endswith("_test.cc") else code_deps
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1)
                if target in allowed and target != layer and target not in deps:
                    found.append(f"{path.relative_to(root)}:{number}: {layer} includes {target}/, which it may not "
                                 f"use (docs/architecture.md, Layers: {layer} may use {', '.join(sorted(deps)) or 'nothing'})")
    return found


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    order, rules = read_rules((root / "docs" / "architecture.md").read_text())
    found = violations(root, order, closure(rules))
    for v in found:
        print(v, file=sys.stderr)
    if found:
        print(f"{len(found)} include(s) against the layer table", file=sys.stderr)
        return 1
    print(f"layers: every include of src/ follows docs/architecture.md's table ({len(rules)} layers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
