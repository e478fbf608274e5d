#!/usr/bin/env python3
"""Compares two replays of the shipped scenarios, stack by stack.

    python3 scenarios/compare.py OLD_DIR NEW_DIR

Each directory holds one `outage_replay --json --seeds N scenarios/NAME.toml`
output per scenario, as NAME.json. Prints, per scenario and stack, the
median over the seeds of answers, the user error rate, the answered wait
p99 and the wasted cost, old and new, and marks every line where one
differs; the last line counts them. A file that is not valid JSON, or
that one directory lacks, is reported, not skipped silently.
"""

import json
import sys
from pathlib import Path

FIELDS = [
    ("answered", "answers", "{:.0f}"),
    ("user_error_rate", "errors", "{:.4f}"),
    ("answered_wait_p99_s", "wait p99 s", "{:.2f}"),
    ("wasted_cost_usd", "wasted $", "{:.2f}"),
]


def load(path):
    try:
        data = json.loads(path.read_text())
        return {s["name"]: s for s in data["stacks"]}, None
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"{path}: {e}"


def median(stack, field):
    value = stack.get(field)
    return value.get("median") if isinstance(value, dict) else value


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    old_dir, new_dir = Path(argv[1]), Path(argv[2])
    names = sorted({p.stem for p in old_dir.glob("*.json")} | {p.stem for p in new_dir.glob("*.json")})
    header = "  ".join(f"{label:>22}" for _, label, _ in FIELDS)
    print(f"{'scenario':<32} {'stack':<16} {header}   (old -> new)")
    compared = differing = problems = 0
    for name in names:
        old, err_old = load(old_dir / f"{name}.json")
        new, err_new = load(new_dir / f"{name}.json")
        for err in (err_old, err_new):
            if err:
                print(f"  problem: {err}")
                problems += 1
        if old is None or new is None:
            continue
        for stack in sorted(old.keys() | new.keys()):
            a, b = old.get(stack), new.get(stack)
            if a is None or b is None:
                print(f"{name:<32} {stack:<16} only in {'new' if a is None else 'old'}")
                differing += 1
                continue
            cells, same = [], True
            for field, _, fmt in FIELDS:
                va, vb = median(a, field), median(b, field)
                same &= va == vb
                show = lambda v: "-" if v is None else fmt.format(v)
                cells.append(f"{show(va) + ' -> ' + show(vb):>22}")
            compared += 1
            differing += not same
            print(f"{name:<32} {stack:<16} {'  '.join(cells)}{'' if same else '   DIFFERS'}")
    print(f"{compared} stacks compared over {len(names)} scenarios: {differing} differ, {problems} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
