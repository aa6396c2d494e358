#!/usr/bin/env bash
# Constant-memory quality at a fixed state budget (issue 15): perplexity on a held-out text with
# exact attention and with every O(1) policy holding at most the bytes of sink+window
# W' = BUDGET positions per planned layer, sinks included (`--o1-budget W'-S`: each policy
# spends those bytes its own way; the sealed state is f32 in every policy):
#   sink+window        --o1-far none --o1-split off      (StreamingLLM, every layer W'-S)
#   score eviction     --o1-far none --kv-evict score --o1-split off   (12 B per slot of scores)
#   ... windows split  the same two with each layer's share of the same total, by the window
#                      curves the polish measured on TRAIN
#   learned far field  the far state per KV head beside sink+window, windows split
#   score + far field  both
# All rows run on MODEL polished by `cortiq polish --o1-far linear` (the source weights plus the
# far field and the window curves, trained on TRAIN, disjoint from TEXT; --o1-far none drops the
# far field, --o1-split off the split), so every row has the same weights as the source model.
# Prints a markdown table per model and context: ppl, ratio to exact, the share of
# sink+window's excess closed (1 − (x − exact)/(sw − exact)) and the state bytes each run reports.
#
# Usage: bench/o1_budget.sh [MODEL ...]   (known cortiq names; default: the three)
# Environment: TEXT (lcet10.txt), TRAIN (alice29.txt), CTXS ("2048 4096"), BUDGETS ("128 512"),
# CHUNKS (2), SINKS (4), RANK (16), FAR_STEPS (400), FAR_WINDOWS (8), FAR_CTX (2048), FAR_WINDOW
# (the window the far field is fitted beside, on average: 115 = 128 − 4 sinks − the 9 positions
# of a rank-16 far state at head_dim 64), FAR_RULE (window: the eviction rule the far field is
# fitted beside), FAR_DIR (~/.cache/cortiq/far: polished models, reused when present; each
# polish's per-layer log beside it as MODEL.cmf.log), CORTIQ (target/release/cortiq).
# WRITE=1 appends the tables to BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "o1_budget.sh: $*" >&2; exit 1; }
CORTIQ=${CORTIQ:-target/release/cortiq}
[ -x "$CORTIQ" ] || die "build cortiq first: cargo build --release -p cortiq-cli"
TEXT=${TEXT:-lcet10.txt}; TRAIN=${TRAIN:-alice29.txt}
CTXS=${CTXS:-2048 4096}; BUDGETS=${BUDGETS:-128 512}; CHUNKS=${CHUNKS:-2}; SINKS=${SINKS:-4}
RANK=${RANK:-16}; FAR_STEPS=${FAR_STEPS:-400}; FAR_WINDOWS=${FAR_WINDOWS:-8}; FAR_CTX=${FAR_CTX:-2048}
FAR_WINDOW=${FAR_WINDOW:-115}; FAR_RULE=${FAR_RULE:-window}
FAR_DIR=${FAR_DIR:-$HOME/.cache/cortiq/far}
MODELS=("$@"); [ ${#MODELS[@]} -gt 0 ] || MODELS=(smollm2-135m qwen2.5-coder-0.5b gemma3-270m)
text=$("$CORTIQ" pull "$TEXT")
mkdir -p "$FAR_DIR"

REPORT=$(mktemp); trap 'rm -f "$REPORT"' EXIT
out() { echo "$@" | tee -a "$REPORT"; }
# ppl MODEL CTX FLAGS... -> "PPL BYTES"
ppl() {
    local m=$1 c=$2; shift 2
    local o
    o=$("$CORTIQ" ppl -m "$m" -f "$text" -c "$c" --chunks "$CHUNKS" "$@" 2>&1) || die "ppl failed ($*): $o"
    echo "$(sed -n 's/^PPL = \([0-9.]*\).*/\1/p' <<<"$o") $(sed -n 's/^state at the end of a chunk: \([0-9]*\) bytes.*/\1/p' <<<"$o")"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", a/b}'; }
closed() { awk -v x="$1" -v e="$2" -v s="$3" 'BEGIN{printf "%.1f%%", 100 * (1 - (x - e) / (s - e))}'; }
kb() { awk -v a="$1" 'BEGIN{printf "%.0f", a/1024}'; }

out "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
out "command: CTXS=\"$CTXS\" BUDGETS=\"$BUDGETS\" CHUNKS=$CHUNKS SINKS=$SINKS RANK=$RANK FAR_STEPS=$FAR_STEPS FAR_WINDOWS=$FAR_WINDOWS FAR_CTX=$FAR_CTX FAR_WINDOW=$FAR_WINDOW FAR_RULE=$FAR_RULE bench/o1_budget.sh ${MODELS[*]}"
out "text: $TEXT held out (far fields and window curves from $TRAIN); each chunk: the first half exact (the sealed prompt), the second half scored"
for name in "${MODELS[@]}"; do
    path=$("$CORTIQ" pull "$name")
    far="$FAR_DIR/$name-far-r$RANK-w$FAR_WINDOW-c$FAR_CTX-$FAR_RULE-split.cmf"
    if [ ! -f "$far" ]; then
        t0=$(date +%s)
        "$CORTIQ" polish -m "$path" -o "$far" --o1-far linear --o1-window "$FAR_WINDOW" --o1-sinks "$SINKS" --far-rank "$RANK" \
            --ctx "$FAR_CTX" --far-windows "$FAR_WINDOWS" --steps "$FAR_STEPS" --batch 2 --train "$TRAIN" --valid "$TEXT" \
            --far-rule "$FAR_RULE" > "$far.log" 2>&1 || die "polish failed: $(tail -3 "$far.log")"
        tail -1 "$far.log" | tee -a "$REPORT"
        out "far field of $name: trained in $(( $(date +%s) - t0 ))s (window $FAR_WINDOW on average, rank $RANK, rule $FAR_RULE)"
    fi
    for ctx in $CTXS; do
        read -r exact _ <<<"$(ppl "$far" "$ctx" --exact)"
        out
        out "**$name, ctx $ctx**: exact ppl $exact"
        out
        out "| budget W' | policy | flags | ppl | ratio to exact | excess closed | state KiB |"
        out "|---|---|---|---|---|---|---|"
        for b in $BUDGETS; do
            n=$((b - SINKS))
            row() { # NAME FLAGS...
                local label=$1; shift
                read -r x xb <<<"$(ppl "$far" "$ctx" --o1-budget "$n" --kv-sinks "$SINKS" "$@")"
                out "| $b | $label | --o1-budget $n $* | $x | $(ratio "$x" "$exact") | $(closed "$x" "$exact" "$sw") | $(kb "$xb") |"
            }
            read -r sw swb <<<"$(ppl "$far" "$ctx" --o1-budget "$n" --kv-sinks "$SINKS" --o1-far none --o1-split off)"
            out "| $b | sink+window | --o1-budget $n --o1-far none --o1-split off | $sw | $(ratio "$sw" "$exact") | 0% | $(kb "$swb") |"
            row "score eviction" --o1-far none --kv-evict score --o1-split off
            row "sink+window, windows split" --o1-far none
            row "score eviction, windows split" --o1-far none --kv-evict score
            row "learned far field (r $RANK), windows split" --o1-far linear
            row "score eviction + learned far field, windows split" --o1-far linear --kv-evict score
        done
    done
done
if [ "${WRITE:-0}" = 1 ]; then
    { echo; echo "### O(1) at a fixed state budget, $(date -u +%Y-%m-%d)"; echo; cat "$REPORT"; } >> BENCHMARKS.md
    echo "appended to BENCHMARKS.md" >&2
fi
