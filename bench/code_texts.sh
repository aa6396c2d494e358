#!/usr/bin/env bash
# The texts of issue 52's coder conversions (BENCHMARKS.md, 2026-12-07 sections): Python source
# for the heal and the fold's calibration, beside the prose texts cortiq already fetches.
#   code-train.txt  the Python 3.11 standard library's argparse, textwrap, csv, fractions,
#                   statistics, heapq, difflib, shlex and calendar modules, in that order (356 KB)
#   code-valid.txt  held out: bisect, string and json/decoder
#   mix.txt         the calibration file of `convert --linear-core ... --calib`: four blocks,
#                   each 2,000 bytes of code-train (from offsets 0, 80,000, 160,000, 240,000)
#                   then 2,000 bytes of alice29 (from offsets 0, 40,000, 80,000, 120,000),
#                   ~4 windows of 1024 tokens
#   mixB.txt        with BLOCKS=B (not 4): B such blocks, from offsets i·320,000/B of code-train
#                   and i·160,000/B of alice29 (B up to 16; BLOCKS=16: ~15 windows of 1024
#                   tokens, for `--calib-windows 16`)
# The standard library is the running python3's (3.11.7 for the published figures; another
# version gives other bytes, and the script says which it used).
#
# Usage: bench/code_texts.sh [OUT]   (default /tmp/code_texts; prints the three paths)
# Environment: BLOCKS (4), CORTIQ (to fetch alice29.txt into the cache when it is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/code_texts}; CORTIQ=${CORTIQ:-target/release/cortiq}
mkdir -p "$OUT"
lib=$(python3 -c 'import os, argparse; print(os.path.dirname(argparse.__file__))')
echo "python: $(python3 -c 'import sys; print(sys.version.split()[0])') ($lib)" >&2
train=(argparse textwrap csv fractions statistics heapq difflib shlex calendar)
valid=(bisect string json/decoder)
for m in "${train[@]}"; do cat "$lib/$m.py"; done >"$OUT/code-train.txt.tmp"
for m in "${valid[@]}"; do cat "$lib/$m.py"; done >"$OUT/code-valid.txt.tmp"
alice=${CORTIQ_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cortiq}/texts/alice29.txt
if [ ! -f "$alice" ]; then
    [ -x "$CORTIQ" ] || { echo "code_texts.sh: alice29.txt is not cached; build cortiq first" >&2; exit 1; }
    "$CORTIQ" ppl -m smollm2-135m -f alice29.txt -c 64 --chunks 1 >/dev/null 2>&1 || true
    [ -f "$alice" ] || { echo "code_texts.sh: could not fetch alice29.txt" >&2; exit 1; }
fi
# (files, not pipes into head: under pipefail a reader that stops early fails the writer)
BLOCKS=${BLOCKS:-4}
[[ "$BLOCKS" =~ ^[0-9]+$ ]] && [ "$BLOCKS" -ge 1 ] && [ "$BLOCKS" -le 16 ] || { echo "code_texts.sh: BLOCKS must be 1..16" >&2; exit 1; }
mix=mix; [ "$BLOCKS" -eq 4 ] || mix=mix$BLOCKS
for ((i = 0; i < BLOCKS; i++)); do
    tail -c +$((i * 320000 / BLOCKS + 1)) "$OUT/code-train.txt.tmp" >"$OUT/block.tmp"; head -c 2000 "$OUT/block.tmp"
    printf '\n\n'
    tail -c +$((i * 160000 / BLOCKS + 1)) "$alice" >"$OUT/block.tmp"; head -c 2000 "$OUT/block.tmp"
    printf '\n\n'
done >"$OUT/$mix.txt.tmp"
rm -f "$OUT/block.tmp"
for f in code-train code-valid $mix; do mv "$OUT/$f.txt.tmp" "$OUT/$f.txt"; echo "$OUT/$f.txt"; done
