#!/usr/bin/env bash
# Speed side by side: llama.cpp's llama-bench and `cortiq bench` on the same GGUF, same
# threads, in one run; prints a markdown table with the ratios. The two tools alternate one
# repetition at a time (REPS rounds per model) and each side reports its median, because this
# machine's speed drifts by up to 2x within minutes: alternating puts both sides under the same
# drift, the median drops the outliers.
# It builds nothing: LLAMACPP_DIR must point at an existing llama.cpp build (see MODELS.md for
# the flags), and cortiq is taken from target/release (cargo build --release -p cortiq-cli).
#
# Usage: LLAMACPP_DIR=/path/to/build bench/side_by_side.sh [NAME ...]
#   With WRITE=1 the table (with its machine/date/command header) is also appended to
#   BENCHMARKS.md under a "side by side" heading, to be described by hand.
#   NAME: known cortiq model names or GGUF paths (default: smollm2-135m gemma3-270m
#   qwen2.5-coder-0.5b)
# Environment: THREADS (2), PP (512), TG (128), REPS (5 alternating rounds), CORTIQ_FLAGS (extra
# flags, e.g. --numerics exact or --numerics llamacpp; default numerics: fast); CORTIQ_SIMD
# (avx2: the AVX2 tier on an AVX-512 CPU, against a llama.cpp built without AVX-512) is passed
# on and printed in the header.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "side_by_side.sh: $*" >&2; exit 1; }
[ -n "${LLAMACPP_DIR:-}" ] || die "set LLAMACPP_DIR to an existing llama.cpp build directory"
BENCH="$LLAMACPP_DIR/bin/llama-bench"; [ -x "$BENCH" ] || BENCH="$LLAMACPP_DIR/llama-bench"
[ -x "$BENCH" ] || die "no llama-bench under $LLAMACPP_DIR"
CORTIQ=${CORTIQ:-target/release/cortiq}
[ -x "$CORTIQ" ] || CORTIQ="${CARGO_TARGET_DIR:-target}/release/cortiq"
[ -x "$CORTIQ" ] || die "build cortiq first: cargo build --release -p cortiq-cli"
T=${THREADS:-2}; PP=${PP:-512}; TG=${TG:-128}; R=${REPS:-5}
MODELS=("$@"); [ ${#MODELS[@]} -gt 0 ] || MODELS=(smollm2-135m gemma3-270m qwen2.5-coder-0.5b)

# tok/s from llama-bench's markdown row for a test name (pp512 / tg128): "| ... | 123.45 ± 1.2 |"
llama_rate() { grep -E "\| +$2 +\|" <<<"$1" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}'; }
cortiq_rate() { grep -E "^$2:" <<<"$1" | awk '{print $2}'; }

REPORT=$(mktemp); trap 'rm -f "$REPORT"' EXIT
out() { echo "$@" | tee -a "$REPORT"; }
out "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; threads $T; $(date -u +%Y-%m-%dT%H:%MZ)"
out "command: ${CORTIQ_SIMD:+CORTIQ_SIMD=$CORTIQ_SIMD }LLAMACPP_DIR=$LLAMACPP_DIR REPS=$R THREADS=$T bench/side_by_side.sh ${MODELS[*]}; cortiq flags: ${CORTIQ_FLAGS:-(none)}; medians of $R alternating rounds"
out
out "| model | llama.cpp pp$PP | cortiq pp$PP | ratio | llama.cpp tg$TG | cortiq tg$TG | ratio |"
out "|---|---|---|---|---|---|---|"
median() { sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else printf "%.2f\n", (a[NR/2] + a[NR/2+1]) / 2}'; }
for name in "${MODELS[@]}"; do
    if [ -f "$name" ]; then path=$name; else path=$("$CORTIQ" pull "$name"); fi
    lpp_all=""; ltg_all=""; cpp_all=""; ctg_all=""
    for _ in $(seq "$R"); do
        lb=$("$BENCH" -m "$path" -t "$T" -p "$PP" -n "$TG" -r 1 -o md 2>/dev/null)
        # shellcheck disable=SC2086
        cb=$("$CORTIQ" bench -m "$path" -t "$T" -p "$PP" -n "$TG" -r 1 ${CORTIQ_FLAGS:-})
        lpp_all+="$(llama_rate "$lb" "pp$PP")"$'\n'; ltg_all+="$(llama_rate "$lb" "tg$TG")"$'\n'
        cpp_all+="$(cortiq_rate "$cb" "pp$PP")"$'\n'; ctg_all+="$(cortiq_rate "$cb" "tg$TG")"$'\n'
    done
    lpp=$(grep . <<<"$lpp_all" | median); ltg=$(grep . <<<"$ltg_all" | median)
    cpp=$(grep . <<<"$cpp_all" | median); ctg=$(grep . <<<"$ctg_all" | median)
    rpp=$(awk -v a="$cpp" -v b="$lpp" 'BEGIN{printf "%.2f", a/b}')
    rtg=$(awk -v a="$ctg" -v b="$ltg" 'BEGIN{printf "%.2f", a/b}')
    out "| $name | $lpp | $cpp | $rpp | $ltg | $ctg | $rtg |"
done
if [ "${WRITE:-0}" = 1 ]; then
    { echo; echo "### side by side, $(date -u +%Y-%m-%d)"; echo; cat "$REPORT"; } >> BENCHMARKS.md
    echo "appended to BENCHMARKS.md" >&2
fi
