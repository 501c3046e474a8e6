#!/usr/bin/env python3
"""Finds temporaries with destructors passed into a co_await expression (docs/pitfalls.md, kCoAwaitTemporaries).

g++ 12 destroys some temporaries of a co_await expression twice. The rule: name such a value in a statement of its
own, then co_await the named awaitable. This check reads each co_await expression (up to its end: the statement's
';', or the ')' that closes an enclosing condition) and reports the ones that build a string, JSON or container
temporary inside it. It is a grep with brackets, not a compiler: it knows the shapes the code has had.
Usage: check_co_await.py FILE...   Exit status 1 when it reports any.
"""
import re
import sys

# Expressions that make a temporary with a destructor.
TEMPORARY = [
    (re.compile(r'std::string\s*\('), 'a std::string temporary'),
    (re.compile(r'std::to_string\s*\('), 'a std::to_string temporary'),
    (re.compile(r'\.dump\s*\('), 'a JSON dump() string temporary'),
    (re.compile(r'"\s*\+|\+\s*"'), 'a string concatenation temporary'),
    (re.compile(r'\bjson\s*[({]'), 'a JSON temporary'),
    (re.compile(r'std::(vector|map|function|make_shared|make_unique)\b'), 'a container or owner temporary'),
]


def strip(text):
    """Blanks comments and the insides of string literals, keeping the quotes and the line structure."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif text[i] == '"' or (text[i] == "'" and i > 0 and not text[i - 1].isalnum()):
            q, j = text[i], i + 1
            while j < n and text[j] != q:
                j += 2 if text[j] == '\\' else 1
            out.append(q + ' ' * (j - i - 1) + q); i = j + 1
        else:
            out.append(text[i]); i += 1
    return ''.join(out)


def expression_at(code, start):
    """The co_await expression from `start`: to the ';' or ',' at its own depth, or the bracket closing around it."""
    depth, i = 0, start
    while i < len(code):
        c = code[i]
        if c in '([{':
            depth += 1
        elif c in ')]}':
            if depth == 0:
                break
            depth -= 1
        elif c in ';,' and depth == 0:
            break
        i += 1
    return code[start:i]


def without_lambda_bodies(expr):
    """Blanks the bodies of lambdas: they run later, as ordinary functions, and their temporaries are theirs."""
    out, i = list(expr), 0
    while i < len(expr):
        if expr[i] == '{':
            before = expr[:i].rstrip()
            if before.endswith((')', ']', 'mutable')) or re.search(r'->\s*[\w:<>, ]+$', before):
                depth, j = 0, i
                while j < len(expr):
                    depth += expr[j] == '{'
                    depth -= expr[j] == '}'
                    if depth == 0:
                        break
                    j += 1
                arrow = re.search(r'->\s*[\w:<>, ]+$', before)
                if arrow:  # a trailing return type names a type; it makes no temporary
                    for k in range(arrow.start(), len(before)):
                        out[k] = ' '
                for k in range(i + 1, min(j, len(expr))):
                    if out[k] != '\n':
                        out[k] = ' '
                i = j
        i += 1
    return ''.join(out)


def main(paths):
    found = 0
    for path in paths:
        with open(path, encoding='utf-8') as f:
            code = strip(f.read())
        for m in re.finditer(r'\bco_await\b', code):
            expr = without_lambda_bodies(expression_at(code, m.end()))
            for pattern, what in TEMPORARY:
                if pattern.search(expr):
                    line = code.count('\n', 0, m.start()) + 1
                    print(f'{path}:{line}: {what} inside a co_await; name it first (docs/pitfalls.md)')
                    found += 1
                    break
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
