#!/usr/bin/env python3
"""Functions longer than a limit in Rust sources (default 150 lines), and files longer than 1,500.

Usage: python3 tools/fn_lengths.py DIR... [--max N]

A function's length runs from its `fn` line to the line of its matching closing brace (string
and char literals and line comments stripped before braces are counted). Prints one line per
function or file over the limits; exit status 1 when there is any.
"""

import re
import sys
from pathlib import Path

FN = re.compile(r"\s*(pub(\([a-z]+\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"C\"\s+)?fn\s+(\w+)")


def long_fns(path: Path, limit: int):
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        m = FN.match(lines[i])
        if m and not lines[i].strip().endswith(";"):
            depth, started, j = 0, False, i
            while j < len(lines):
                code = re.sub(r'"([^"\\]|\\.)*"', '""', lines[j])
                code = re.sub(r"//.*", "", code)
                code = re.sub(r"'([^'\\]|\\.)'", "''", code)
                for ch in code:
                    if ch == "{":
                        depth += 1
                        started = True
                    elif ch == "}":
                        depth -= 1
                if started and depth == 0:
                    break
                j += 1
            n = j - i + 1
            if n > limit:
                yield n, i + 1, m.group(7)
        i += 1


def main() -> int:
    args = sys.argv[1:]
    limit = 150
    if "--max" in args:
        k = args.index("--max")
        limit = int(args[k + 1])
        del args[k : k + 2]
    bad = 0
    for d in args:
        for p in sorted(Path(d).rglob("*.rs")):
            n_lines = len(p.read_text().split("\n"))
            if n_lines > 1500:
                print(f"file {p}: {n_lines} lines")
                bad += 1
            for n, line, name in long_fns(p, limit):
                print(f"{n:5d} lines: {p}:{line} {name}")
                bad += 1
    print(f"{bad} over the limits")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
