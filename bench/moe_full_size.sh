#!/usr/bin/env bash
# Issue 50, point 3: a full-size mixture (Qwen3-30B-A3B's shape, random Q4_K_M-mix weights,
# ~18.6 GB, `bench/moe_geometry.py --layers 48 --random-blocks --mix q4_k_m`) decoding on the
# memory map: the GGUF (experts row-major, as llama.cpp writes them), the same file converted
# by `cortiq convert` (experts stored in the decode kernels' interleaved layout) and llama.cpp's
# llama-bench on the GGUF, alternated ROUNDS times so all three see the same machine drift.
# On a 24 GiB machine the two 18 GB files do not fit the page cache together: before each cortiq
# run the other file is dropped from the cache (`dd iflag=nocache count=0`), and the load reads
# the experts back in (cortiq populates a mapped mixture's experts at load; llama.cpp its map).
# Each cortiq line prints tg32 and its share of the active-parameter roofline (`--roofline`:
# the model's active bytes per token over a 2-thread read probe); max RSS by /usr/bin/time.
# It builds nothing: LLAMACPP_DIR must point at an existing llama.cpp build (MODELS.md has the
# recipe); cortiq comes from target/release.
#
# Usage: LLAMACPP_DIR=/path/to/build bench/moe_full_size.sh GGUF [CMF]
#   CMF: the converted file (default: GGUF with .cmf, written by `cortiq convert` if missing)
# Environment: THREADS (2), TG (32), REPS (2), ROUNDS (2), CORTIQ.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "moe_full_size.sh: $*" >&2; exit 1; }
[ -n "${LLAMACPP_DIR:-}" ] || die "set LLAMACPP_DIR to an existing llama.cpp build directory"
BENCH="$LLAMACPP_DIR/bin/llama-bench"; [ -x "$BENCH" ] || BENCH="$LLAMACPP_DIR/llama-bench"
[ -x "$BENCH" ] || die "no llama-bench under $LLAMACPP_DIR"
export LD_LIBRARY_PATH="$(dirname "$BENCH")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
CORTIQ=${CORTIQ:-target/release/cortiq}
[ -x "$CORTIQ" ] || die "build cortiq first: cargo build --release -p cortiq-cli"
[ $# -ge 1 ] || die "usage: bench/moe_full_size.sh GGUF [CMF]"
G=$1; C=${2:-${G%.gguf}.cmf}
[ -f "$G" ] || die "$G: no such file"
T=${THREADS:-2}; TG=${TG:-32}; REPS=${REPS:-2}; ROUNDS=${ROUNDS:-2}
if [ ! -f "$C" ]; then
  echo "converting $G -> $C"
  "$CORTIQ" convert -m "$G" -o "$C"
fi
drop() { dd if="$1" iflag=nocache count=0 2>/dev/null || true; }
run_cortiq() {
  local f=$1 out
  out=$(/usr/bin/time -f "maxrss %M KB" "$CORTIQ" bench -m "$f" -t "$T" -p 0 -n "$TG" -r "$REPS" --roofline 2>&1)
  local tg pct rss
  tg=$(grep -E "^tg$TG:" <<<"$out" | awk '{print $2}')
  pct=$(grep -E "^roofline:" <<<"$out" | grep -oE "reached [0-9.]+%" | awk '{print $2}')
  rss=$(grep -E "^maxrss" <<<"$out" | awk '{printf "%.1f GB", $2 / 1e6}')
  echo "$tg tok/s ($pct of the roofline, max RSS $rss)"
}
echo "| round | time (UTC) | GGUF on the map | .cmf (interleaved experts) | llama.cpp | .cmf / GGUF | .cmf / llama.cpp |"
echo "|---|---|---|---|---|---|---|"
for r in $(seq 1 "$ROUNDS"); do
  t=$(date -u +%H:%M)
  drop "$C"; g=$(run_cortiq "$G")
  drop "$G"; c=$(run_cortiq "$C")
  drop "$C"
  l=$("$BENCH" -m "$G" -t "$T" -p 0 -n "$TG" -r "$REPS" 2>&1 | grep -E "\| +tg$TG +\|" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
  ratio() { awk -v a="${1%% *}" -v b="${2%% *}" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }
  echo "| $r | $t | $g | $c | $l tok/s | $(ratio "$c" "$g") | $(ratio "$c" "$l") |"
done
