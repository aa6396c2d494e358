#!/usr/bin/env bash
# Decode at depth side by side (issue 18): llama.cpp's llama-bench (its default f16 KV cache) and
# `cortiq bench --roofline` on the same GGUF, same threads, tg32 after a context of D tokens, in
# one run; the tools alternate per (model, depth) so both sides see the same machine drift.
# cortiq runs once per KV type (KV_TYPES); its roofline share counts the weights and the K/V
# rows a step reads in their stored type (`bench --roofline`).
# It builds nothing: LLAMACPP_DIR must point at an existing llama.cpp build (MODELS.md has the
# recipe); cortiq comes from target/release.
#
# Usage: LLAMACPP_DIR=/path/to/build bench/long_decode.sh [NAME ...]
#   NAME: cortiq model names or GGUF paths (default: qwen2.5-coder-0.5b gemma3-270m)
# Environment: THREADS (2), DEPTHS ("2048 4096 8192 16384"), KV_TYPES ("f16 q8 f32"), TG (32),
#   PP_DEPTH (8192: also pp512 at this depth; 0 = skip), CORTIQ.
# Prints a markdown table: per model and depth, llama.cpp's tg, then per KV type cortiq's tg,
# the ratio and the share of the roofline.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "long_decode.sh: $*" >&2; exit 1; }
[ -n "${LLAMACPP_DIR:-}" ] || die "set LLAMACPP_DIR to an existing llama.cpp build directory"
BENCH="$LLAMACPP_DIR/bin/llama-bench"; [ -x "$BENCH" ] || BENCH="$LLAMACPP_DIR/llama-bench"
[ -x "$BENCH" ] || die "no llama-bench under $LLAMACPP_DIR"
export LD_LIBRARY_PATH="$(dirname "$BENCH")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
CORTIQ=${CORTIQ:-target/release/cortiq}
[ -x "$CORTIQ" ] || die "build cortiq first: cargo build --release -p cortiq-cli"
T=${THREADS:-2}; TG=${TG:-32}; DEPTHS=${DEPTHS:-"2048 4096 8192 16384"}; KV_TYPES=${KV_TYPES:-"f16 q8 f32"}
PP_DEPTH=${PP_DEPTH:-8192}
MODELS=("$@"); [ ${#MODELS[@]} -gt 0 ] || MODELS=(qwen2.5-coder-0.5b gemma3-270m)

llama_rate() { grep -E "\| +$2 @ d$3 +\|" <<<"$1" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}'; }
cortiq_rate() { grep -E "^$2 @ d$3:" <<<"$1" | awk '{print $4}'; }
roof_share() { sed -n 's/.* reached \([0-9.]*\)%.*/\1/p' <<<"$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0) printf "%.2f", a / b; else print "-" }'; }

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; threads $T; $(date -u +%Y-%m-%dT%H:%MZ)"
echo "command: LLAMACPP_DIR=$LLAMACPP_DIR DEPTHS=\"$DEPTHS\" KV_TYPES=\"$KV_TYPES\" bench/long_decode.sh ${MODELS[*]}"
echo
hdr="| model | depth | llama.cpp tg$TG (f16 KV) |"; sep="|---|---|---|"
for kv in $KV_TYPES; do hdr+=" cortiq $kv | ratio | roofline |"; sep+="---|---|---|"; done
echo "$hdr"; echo "$sep"
for name in "${MODELS[@]}"; do
    if [ -f "$name" ]; then path=$name; else path=$("$CORTIQ" pull "$name"); fi
    for d in $DEPTHS; do
        lb=$("$BENCH" -m "$path" -t "$T" -p 0 -n "$TG" -d "$d" -r 1 -o md 2>/dev/null)
        l=$(llama_rate "$lb" "tg$TG" "$d")
        row="| $(basename "$name") | $d | $l |"
        for kv in $KV_TYPES; do
            cb=$("$CORTIQ" bench -m "$path" -t "$T" -p 0 -n "$TG" -d "$d" -r 2 --kv-type "$kv" --roofline 2>/dev/null)
            c=$(cortiq_rate "$cb" "tg$TG" "$d")
            row+=" $c | $(ratio "$c" "$l") | $(roof_share "$cb")% |"
        done
        echo "$row"
    done
    if [ "$PP_DEPTH" -gt 0 ]; then
        lb=$("$BENCH" -m "$path" -t "$T" -p 512 -n 0 -d "$PP_DEPTH" -r 1 -o md 2>/dev/null)
        l=$(llama_rate "$lb" "pp512" "$PP_DEPTH")
        kv=${KV_TYPES%% *}
        cb=$("$CORTIQ" bench -m "$path" -t "$T" -p 512 -n 0 -d "$PP_DEPTH" -r 2 --kv-type "$kv" 2>/dev/null)
        c=$(cortiq_rate "$cb" "pp512" "$PP_DEPTH")
        echo "| $(basename "$name") | pp512 @ d$PP_DEPTH | $l | $c ($kv) | $(ratio "$c" "$l") | |"
    fi
done
