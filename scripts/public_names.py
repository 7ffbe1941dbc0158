#!/usr/bin/env python3
"""The public names reachable from kvscout.hpp: the types, functions (overloads once),
constants, enums and concepts declared in namespace kvscout and its non-detail namespaces
(deduction guides are not names),
from clang's AST of a unit that includes kvscout.hpp. Prints the count, then the names with
--list.

    python3 scripts/public_names.py [--list]
"""
import collections
import json
import os
import subprocess
import sys
import tempfile

KINDS = {'CXXRecordDecl', 'ClassTemplateDecl', 'TypeAliasDecl', 'TypedefDecl',
         'TypeAliasTemplateDecl', 'FunctionDecl', 'FunctionTemplateDecl', 'VarDecl',
         'VarTemplateDecl', 'ConceptDecl', 'EnumDecl'}


def walk(node, path, names):
    for c in node.get('inner', []):
        kind, name = c.get('kind'), c.get('name')
        if kind == 'NamespaceDecl':
            if name and name != 'detail' and not name.startswith('__'):
                walk(c, path + [name], names)
        elif name and not name.startswith('<') and kind in KINDS and not c.get('isImplicit'):
            names.setdefault('::'.join(path + [name]), kind)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.NamedTemporaryFile('w', suffix='.cpp', delete=False) as f:
        f.write('#include <kvscout/kvscout.hpp>\n')
    cmd = ['clang++', '-std=c++20', '-I' + os.path.join(root, 'include'),
           '-I/usr/local/cuda/include/cccl', '-isystem', '/usr/local/cuda/include',
           '-fsyntax-only', '-Xclang', '-ast-dump=json', f.name]
    ast = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    os.unlink(f.name)
    names = {}
    for c in ast.get('inner', []):
        if c.get('kind') == 'NamespaceDecl' and c.get('name') == 'kvscout':
            walk(c, ['kvscout'], names)
    print(len(names), 'public names;', dict(collections.Counter(names.values())))
    if '--list' in sys.argv:
        print('\n'.join(sorted(names)))


if __name__ == '__main__':
    main()
