#!/usr/bin/env bash
# Prefill at depth side by side (issue 18, acceptance 3): llama.cpp's llama-bench (its default
# f16 KV cache) and `cortiq bench` (its default KV type unless KV_TYPE is set), pp512 after
# DEPTH positions, the two tools alternating one round at a time (this machine's speed drifts).
# It builds nothing: LLAMACPP_DIR must point at an existing llama.cpp build (MODELS.md has the
# recipe); cortiq is taken from target/release.
#
# Usage: LLAMACPP_DIR=/path/to/build bench/pp_depth.sh [NAME ...]
#   NAME: known cortiq model names or GGUF paths (default: qwen2.5-coder-0.5b gemma3-270m)
# Environment: THREADS (2), DEPTH (8192), PP (512), ROUNDS (2), KV_TYPE, CORTIQ.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "pp_depth.sh: $*" >&2; exit 1; }
[ -n "${LLAMACPP_DIR:-}" ] || die "set LLAMACPP_DIR to an existing llama.cpp build directory"
BENCH="$LLAMACPP_DIR/bin/llama-bench"; [ -x "$BENCH" ] || BENCH="$LLAMACPP_DIR/llama-bench"
[ -x "$BENCH" ] || die "no llama-bench under $LLAMACPP_DIR"
CORTIQ=${CORTIQ:-target/release/cortiq}
[ -x "$CORTIQ" ] || die "build cortiq first: cargo build --release -p cortiq-cli"
T=${THREADS:-2}; D=${DEPTH:-8192}; PP=${PP:-512}; R=${ROUNDS:-2}
MODELS=("$@"); [ ${#MODELS[@]} -gt 0 ] || MODELS=(qwen2.5-coder-0.5b gemma3-270m)
kv=(); [ -n "${KV_TYPE:-}" ] && kv=(--kv-type "$KV_TYPE")
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; threads $T; $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo "| model | round | llama.cpp pp$PP @ d$D | cortiq | ratio |"
echo "|---|---|---|---|---|"
for name in "${MODELS[@]}"; do
    if [ -f "$name" ]; then path=$name; else path=$("$CORTIQ" pull "$name"); fi
    for r in $(seq 1 "$R"); do
        l=$("$BENCH" -m "$path" -t "$T" -p "$PP" -n 0 -d "$D" -r 1 -o md 2>/dev/null \
            | grep -E "\| +pp$PP" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
        c=$("$CORTIQ" bench -m "$path" -t "$T" -p "$PP" -n 0 -d "$D" -r 1 "${kv[@]}" 2>/dev/null \
            | sed -n "s/^pp$PP @ d$D: *\([0-9.]*\).*/\1/p")
        ratio=$(awk -v c="$c" -v l="$l" 'BEGIN { if (l > 0 && c > 0) printf "%.2f", c / l; else print "?" }')
        echo "| $(basename "$name") | $r | $l | $c | $ratio |"
    done
done
