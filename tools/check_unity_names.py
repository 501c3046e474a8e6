#!/usr/bin/env python3
"""Checks that no two files of one unity-built target define the same file-local name in the same namespace.

A unity batch (cmake/unity.cmake) compiles up to 8 files of a library, program or test binary as one translation
unit. Two files that each define `MakeSet` in an anonymous namespace then define it twice: with the same signature
the batch fails to compile, which is loud; with different signatures the two join one overload set, and a call may
silently pick the other file's helper. Batches move as files are added, so the check covers all files of a target,
not only those that share a batch today.

It reads the batches a configured build folder compiles (<build>/**/unity/<target>_<n>.cc) and, in each included
file, the names defined at the start of a line (clang-format puts namespace members there) inside an anonymous
namespace: functions, types, constants and aliases. A name that two files define in the same enclosing namespace is
reported. Identical `using x = y;` aliases are allowed (they declare the same thing twice, which C++ permits).

Usage: check_unity_names.py BUILD_DIR [SOURCE_DIR]   (exit 1 listing the clashes)
"""
import collections
import os
import re
import sys

FUNCTION = re.compile(r'^(?:static\s+|inline\s+|constexpr\s+)*[\w:<>,*&\s]+?[\s*&](\w+)\s*\([^;]*$')
TYPE = re.compile(r'^(?:struct|class|enum class|enum|union)\s+(\w+)\b(?!;)')
CONSTANT = re.compile(r'^(?:static\s+)?(?:constexpr|const|inline)\s+[\w:<>,\s*&]+?\s(\w+)(?:\[\])?\s*(?:=|\{)')
ALIAS = re.compile(r'^using\s+(\w+)\s*=\s*(.*);')
OPEN = re.compile(r'^(?:inline\s+)?namespace\s*([\w:]*)\s*\{\s*$')
CLOSE = re.compile(r'^\}\s*//\s*namespace')
NOT_NAMES = {'TEST', 'TEST_F', 'TEST_P', 'TYPED_TEST', 'INSTANTIATE_TEST_SUITE_P', 'operator', 'main'}


def file_local_names(path):
    """{(namespace, name): definition text} for the names `path` defines inside anonymous namespaces."""
    names = {}
    stack = []
    raw_end = None  # inside a raw string literal: its closing `)delimiter"`
    with open(path, encoding='utf-8', errors='replace') as f:
        for line in f:
            if raw_end:
                if raw_end in line:
                    raw_end = None
                continue
            opening = re.search(r'R"([^(\s]*)\(', line)
            if opening and ')' + opening.group(1) + '"' not in line[opening.end():]:
                raw_end = ')' + opening.group(1) + '"'
                continue
            opened = OPEN.match(line)
            if opened:
                stack.append(opened.group(1))
                continue
            if CLOSE.match(line):
                if stack:
                    stack.pop()
                continue
            if '' not in stack or line[:1] in ' \t#/{}':
                continue
            where = '::'.join(part for part in stack if part)
            alias = ALIAS.match(line)
            if alias:
                names[(where, alias.group(1))] = 'using = ' + alias.group(2).strip()
                continue
            for pattern in (TYPE, CONSTANT, FUNCTION):
                found = pattern.match(line)
                if found and found.group(1) not in NOT_NAMES:
                    names[(where, found.group(1))] = None
                    break
    return names


def batches_by_target(build_dir):
    """{target: [batch files]} for the batches the build folder's build.ninja compiles (a batch file left from an
    earlier configuration, no longer built, is not read)."""
    with open(os.path.join(build_dir, 'build.ninja'), encoding='utf-8') as f:
        built = set(re.findall(r'[^\s$:]*/unity/[\w.-]+_\d+\.cc(?=[\s:|]|$)', f.read()))
    targets = collections.defaultdict(list)
    for path in sorted(built):
        batch = path if os.path.isabs(path) else os.path.join(build_dir, path)
        match = re.match(r'(.+)_\d+\.cc$', os.path.basename(batch))
        if match and os.path.exists(batch):
            targets[match.group(1)].append(os.path.normpath(batch))
    return targets


def clashes(build_dir, source_dir):
    found = []
    for target, batches in sorted(batches_by_target(build_dir).items()):
        included = []
        for batch in batches:
            with open(batch, encoding='utf-8') as f:
                for line in f:
                    match = re.match(r'#include "(.+)"', line)
                    if match:
                        included.append(os.path.normpath(os.path.join(source_dir, 'src', match.group(1))))
        definers = collections.defaultdict(list)
        for path in dict.fromkeys(included):
            if not os.path.exists(path):
                continue  # removed since the folder was configured: the build reconfigures first
            for key, text in file_local_names(path).items():
                definers[key].append((os.path.relpath(path, source_dir), text))
        for (where, name), places in sorted(definers.items()):
            if len(places) < 2:
                continue
            texts = {text for _, text in places}
            if len(texts) == 1 and next(iter(texts)) is not None:
                continue  # the same alias, declared again
            found.append(f'{target}: {where}::{name} is file-local in ' + ', '.join(p for p, _ in places))
    return found


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    build_dir = argv[1]
    source_dir = argv[2] if len(argv) > 2 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = clashes(build_dir, source_dir)
    for line in found:
        print(line)
    if found:
        print(f'{len(found)} file-local names defined in two files of one unity-built target: give each its own '
              'name, or move a shared helper into a header (cmake/unity.cmake)', file=sys.stderr)
        return 1
    print(f'unity names: no file-local name defined twice in one target ({len(batches_by_target(build_dir))} '
          'targets)')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
