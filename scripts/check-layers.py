#!/usr/bin/env python3
"""Checks that src/ imports run one way: the `mod` declarations in src/lib.rs list the
layers bottom up, and a module may name only modules of its own layer's files below
it or of layers listed before its own. Prints every upward edge; exits 1 if any.
Within a layer folder (btree/, wal/, engine/, space/, io/), files may name each other,
and `../shared/tools/layers.py` (run by CI) separately refuses any circle."""
import os, re, subprocess, sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
lib = open(os.path.join(root, "src/lib.rs")).read()
order = re.findall(r"^\s*(?:pub\s+)?mod\s+(\w+)\s*;", lib, flags=re.M)
rank = {m: i for i, m in enumerate(order)}
tool = os.path.join(root, "..", "shared", "tools", "layers.py")
sys.path.insert(0, os.path.dirname(tool))
# Reuse layers.py's edge extraction by running it as a module body.
src = os.path.join(root, "src")
ns = {"__name__": "layers", "sys": sys}
argv = sys.argv
sys.argv = ["layers.py", src]
try:
    exec(compile(open(tool).read().replace("sys.exit(1 if sccs else 0)", ""), tool, "exec"), ns)
except SystemExit:
    pass
sys.argv = argv
bad = 0
for a, targets in sorted(ns["edges"].items()):
    for b, names in sorted(targets.items()):
        la, lb = a.split("::")[0], b.split("::")[0]
        if la == "crate" or lb == la:
            continue
        if lb == "crate" or rank.get(lb, -1) > rank.get(la, 10**6):
            print("upward: %s -> %s (%s)" % (a, b, ", ".join(sorted(names))))
            bad += 1
print("upward imports: %d" % bad)
sys.exit(1 if bad else 0)
