#!/usr/bin/env python3
"""Every relative link in the repository's Markdown files resolves: the file exists, and a '#section' names one of
its headings (GitHub's anchors: lower case, punctuation dropped, spaces as '-').
Usage: check_doc_links.py [ROOT]   Exit status 1, listing the broken links, when any is broken."""
import os
import re
import subprocess
import sys

LINK = re.compile(r'(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')


def anchors(path):
    names = set()
    with open(path, encoding='utf-8') as f:
        in_code = False
        for line in f:
            if line.startswith('```'):
                in_code = not in_code
            if in_code:
                continue
            m = re.match(r'#{1,6}\s+(.*?)\s*#*\s*$', line)
            if m:
                text = re.sub(r'[`*]|\[([^\]]*)\]\([^)]*\)', r'\1', m.group(1)).strip().lower()
                names.add(re.sub(r'[^\w\- ]', '', text).replace(' ', '-'))
    return names


def main(root):
    files = subprocess.run(['git', 'ls-files', '*.md'], cwd=root, capture_output=True, text=True,
                           check=True).stdout.split()
    broken = []
    for doc in files:
        if 'node_modules' in doc:
            continue
        with open(os.path.join(root, doc), encoding='utf-8') as f:
            text = re.sub(r'```.*?```', '', f.read(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r'[a-z]+:', target):  # http:, https:, mailto:: outside the repository, not checked here
                continue
            path, _, section = target.partition('#')
            full = os.path.normpath(os.path.join(root, os.path.dirname(doc), path)) if path else os.path.join(root, doc)
            if not os.path.exists(full):
                broken.append(f'{doc}: ({target}): no such file')
            elif section and full.endswith('.md') and section.lower() not in anchors(full):
                broken.append(f'{doc}: ({target}): no heading makes the anchor #{section}')
    for b in broken:
        print(b)
    return 1 if broken else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')))
