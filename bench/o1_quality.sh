#!/usr/bin/env bash
# O(1)-memory decode quality (issue 5): perplexity on a text with exact attention, with the
# Nyström O(1) operator (--o1) and with the StreamingLLM sink+window baseline (--kv-window) at
# EQUAL STATE BYTES, for windows W and landmark caps m. Prints markdown tables (ratios to exact).
#
# How equal bytes are found: the baseline's state is linear in its window (bytes = a + b·W);
# two baseline runs (W = 64 and 256) give a and b, and each O(1) run's reported state bytes
# (`state at the end of a chunk: N bytes`, the sequence state when a chunk's last token is
# scored: exact window + sinks + skeleton + accumulators) give the baseline window
# W' = round((N − a) / b) that holds the same bytes, which is then run.
#
# Usage: bench/o1_quality.sh [MODEL ...]    (known cortiq names or paths; default: the three)
# Environment: TEXT (lcet10.txt in the cortiq text cache), CTXS ("2048 4096"), WINDOWS
# ("64 256"), LANDMARKS ("32 64 128"), CHUNKS (2: chunks scored per run), RIDGE (1e-3),
# SINKS (4), CORTIQ (target/release/cortiq), FLAGS (extra ppl flags). WRITE=1 appends the
# tables to BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "o1_quality.sh: $*" >&2; exit 1; }
CORTIQ=${CORTIQ:-target/release/cortiq}
[ -x "$CORTIQ" ] || die "build cortiq first: cargo build --release -p cortiq-cli"
TEXT=${TEXT:-$HOME/.cache/cortiq/texts/lcet10.txt}
[ -f "$TEXT" ] || die "no text at $TEXT (see MODELS.md: lcet10.txt from the brotli source package)"
CTXS=${CTXS:-2048 4096}; WINDOWS=${WINDOWS:-64 256}; LANDMARKS=${LANDMARKS:-32 64 128}
CHUNKS=${CHUNKS:-2}; RIDGE=${RIDGE:-1e-3}; SINKS=${SINKS:-4}
MODELS=("$@"); [ ${#MODELS[@]} -gt 0 ] || MODELS=(smollm2-135m qwen2.5-coder-0.5b gemma3-270m)

REPORT=$(mktemp); trap 'rm -f "$REPORT"' EXIT
out() { echo "$@" | tee -a "$REPORT"; }
# ppl MODEL CTX FLAGS... -> "PPL BYTES"
ppl() {
    local m=$1 c=$2; shift 2
    local o
    # shellcheck disable=SC2086
    o=$("$CORTIQ" ppl -m "$m" -f "$TEXT" -c "$c" --chunks "$CHUNKS" ${FLAGS:-} "$@" 2>&1) || die "ppl failed ($*): $o"
    echo "$(sed -n 's/^PPL = \([0-9.]*\).*/\1/p' <<<"$o") $(sed -n 's/^state at the end of a chunk: \([0-9]*\) bytes.*/\1/p' <<<"$o")"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", a/b}'; }
mb() { awk -v a="$1" 'BEGIN{printf "%.1f", a/1e6}'; }

out "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
out "command: CTXS=\"$CTXS\" WINDOWS=\"$WINDOWS\" LANDMARKS=\"$LANDMARKS\" CHUNKS=$CHUNKS RIDGE=$RIDGE SINKS=$SINKS bench/o1_quality.sh ${MODELS[*]}"
out "text: $(basename "$TEXT"); each chunk: the first half exact (the sealed prompt), the second half scored (llama-perplexity's half)"
for name in "${MODELS[@]}"; do
    if [ -e "$name" ]; then path=$name; else path=$("$CORTIQ" pull "$name"); fi
    for ctx in $CTXS; do
        read -r exact exact_b <<<"$(ppl "$path" "$ctx")"
        read -r _ b64 <<<"$(ppl "$path" "$ctx" --kv-window 64 --kv-sinks "$SINKS")"
        read -r _ b256 <<<"$(ppl "$path" "$ctx" --kv-window 256 --kv-sinks "$SINKS")"
        per=$(awk -v a="$b64" -v b="$b256" 'BEGIN{print (b - a) / 192}')
        base=$(awk -v a="$b64" -v p="$per" 'BEGIN{print a - 64 * p}')
        out
        out "**$name, ctx $ctx**: exact ppl $exact (KV $(mb "$exact_b") MB at the chunk's end)"
        out
        out "| W | m | O(1) ppl | ratio | state MB | sink+window W' | ppl | ratio | sink+window W (same window) ppl | ratio |"
        out "|---|---|---|---|---|---|---|---|---|---|"
        for w in $WINDOWS; do
            read -r sw _ <<<"$(ppl "$path" "$ctx" --kv-window "$w" --kv-sinks "$SINKS")"
            for m in $LANDMARKS; do
                read -r o ob <<<"$(ppl "$path" "$ctx" --o1 --o1-far nystrom --o1-window "$w" --o1-sinks "$SINKS" --o1-landmarks "$m" --o1-ridge "$RIDGE")"
                wp=$(awk -v n="$ob" -v a="$base" -v p="$per" 'BEGIN{printf "%d", (n - a) / p + 0.5}')
                read -r e _ <<<"$(ppl "$path" "$ctx" --kv-window "$wp" --kv-sinks "$SINKS")"
                out "| $w | $m | $o | $(ratio "$o" "$exact") | $(mb "$ob") | $wp | $e | $(ratio "$e" "$exact") | $sw | $(ratio "$sw" "$exact") |"
            done
        done
    done
done
if [ "${WRITE:-0}" = 1 ]; then
    { echo; echo "### O(1) quality, $(date -u +%Y-%m-%d)"; echo; cat "$REPORT"; } >> BENCHMARKS.md
    echo "appended to BENCHMARKS.md" >&2
fi
