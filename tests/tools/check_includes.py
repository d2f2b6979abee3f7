#!/usr/bin/env python3
"""The folder rule: a folder exposes one public header named after it (common/common.h,
model/model.h, ...; kernels/ops.h for kernels/) plus the headers that header includes from its own folder (its
public parts). Code in another folder includes only those; every other header of a
folder is private to it. Unit, emulator and fuzz tests (tests/unit, tests/emu, tests/fuzz) may include
the private headers of the folder they test: they check its internals.

Prints each include that breaks the rule and exits 1 if there is any."""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".c", ".h", ".cu", ".cuh", ".cpp")
WHITE_BOX = ("tests/unit/", "tests/emu/", "tests/fuzz/")
# Folders that are not libraries: their headers serve their own programs only.
NOT_LIBRARIES = {"tests", "bench", "examples", "docs", "deploy", "clients"}
# Public headers not named after their folder.
PUBLIC_HEADER = {"kernels": "kernels/ops.h"}


def includes(path):
    try:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            return INCLUDE.findall(f.read())
    except FileNotFoundError:
        return []


def top(path):
    return path.split("/", 1)[0]


def public_headers(folder):
    """folder/folder.h and, transitively, the headers of the same folder it includes."""
    seen, todo = set(), [PUBLIC_HEADER.get(folder, f"{folder}/{folder}.h")]
    while todo:
        h = todo.pop()
        if h in seen or not os.path.exists(os.path.join(ROOT, h)):
            continue
        seen.add(h)
        todo += [i for i in includes(h) if top(i) == folder]
    return seen


def sources():
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith((".", "build")) and x != "var"]
        for f in files:
            if f.endswith(SOURCES):
                yield os.path.relpath(os.path.join(d, f), ROOT)


def main():
    public = {}
    bad = []
    for src in sorted(sources()):
        for inc in includes(src):
            folder = top(inc)
            if "/" not in inc or folder == top(src) or folder in NOT_LIBRARIES:
                continue
            if not os.path.isdir(os.path.join(ROOT, folder)):
                continue
            if src.startswith(WHITE_BOX):
                continue
            if folder not in public:
                public[folder] = public_headers(folder)
            if inc not in public[folder]:
                bad.append(f"{src}: includes {inc}, private to {folder}/ "
                           f"(public: {', '.join(sorted(public[folder])) or 'none'})")
    for line in bad:
        print(line)
    if bad:
        print(f"check_includes: {len(bad)} include(s) break the folder rule", file=sys.stderr)
        return 1
    print("check_includes: every cross-folder include is a public header")
    return 0


if __name__ == "__main__":
    sys.exit(main())
