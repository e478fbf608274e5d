#!/usr/bin/env python3
"""Checks that Cargo.toml's rust-version is at least what every normal
dependency of the library declares, feature by feature, at the versions
Cargo.lock pins. Only one toolchain can be installed here, so this reads the
declarations instead of building with an older compiler."""
import json
import subprocess
import sys


def version(v):
    return tuple(int(x) for x in (v or "0").split("."))


meta = json.loads(subprocess.check_output(
    ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"]))
declared = {(p["name"], p["version"]): p.get("rust_version") for p in meta["packages"]}
ours = next(p for p in meta["packages"] if p["name"] == "tower-circuit-breaker")
# Every feature Cargo.toml declares, each on its own, so a new one is covered
# the day it is added.
FEATURES = [""] + sorted(f for f in ours["features"] if f != "default")
claimed = version(ours["rust_version"])
worst = []
for feature in FEATURES:
    args = ["cargo", "tree", "-e", "normal", "-p", "tower-circuit-breaker", "--prefix", "none", "--locked"]
    if feature:
        args += ["--features", feature]
    need = (0,), "nothing"
    for line in subprocess.check_output(args, text=True).splitlines():
        name, ver = line.split()[:2]
        rv = declared.get((name, ver.lstrip("v")))
        if rv and version(rv) > need[0] and name != "tower-circuit-breaker":
            need = version(rv), f"{name} {ver} declares {rv}"
    worst.append((feature or "(no features)", need))
    print(f"{feature or '(no features)':20} needs {'.'.join(map(str, need[0]))}: {need[1]}")
bad = [(f, n) for f, n in worst if n[0] > claimed]
if bad:
    sys.exit(f"rust-version {ours['rust_version']} is below what {bad[0][0]} needs: {bad[0][1][1]}")
print(f"rust-version {ours['rust_version']} covers every feature")
