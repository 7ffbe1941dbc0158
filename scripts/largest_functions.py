#!/usr/bin/env python3
"""The longest function bodies in include/ (issue 46's goal: none over 80 lines), by a text
heuristic: a line that ends with '{' and holds ')' opens a function unless it is a control
statement, a type or a lambda; its length runs to the matching '}'. Multi-line signatures count
from their last line. Prints the longest N (default 12) and how many exceed the limit.

    python3 scripts/largest_functions.py [N] [LIMIT]
"""
import os
import re
import sys


def main():
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 80
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'include')
    control = re.compile(r'^\s*(if|for|while|switch|else|do|namespace|struct|class|union|enum|'
                         r'return|case|template)\b')
    found = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith(('.hpp', '.cuh')):
                continue
            path = os.path.join(dirpath, name)
            lines = open(path).read().split('\n')
            for i, line in enumerate(lines):
                s = line.strip()
                if not s.endswith('{') or ')' not in s or control.match(s) or s.startswith('//'):
                    continue
                if re.search(r'\]\s*(\(|mutable|\{|->)', s) or re.search(r'=\s*\[', s):
                    continue  # a lambda
                depth, j = 0, i
                while j < len(lines):
                    depth += lines[j].count('{') - lines[j].count('}')
                    if depth <= 0:
                        break
                    j += 1
                found.append((j - i + 1, os.path.relpath(path, os.path.dirname(root)), i + 1))
    found.sort(reverse=True)
    for n, path, at in found[:top]:
        print(f'{n:5d}  {path}:{at}')
    print(f'{sum(1 for f in found if f[0] > limit)} functions over {limit} lines')


if __name__ == '__main__':
    main()
