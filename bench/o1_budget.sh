#!/usr/bin/env bash
# Constant-memory quality at a fixed state budget (issue 15): perplexity on a held-out text with
# exact attention and with every O(1) policy holding at most the bytes of sink+window
# W' = BUDGET (sinks included) per planned layer, at the same KV precision (f32):
#   sink+window     --kv-window W'-S --kv-sinks S
#   score eviction  --kv-window W'-S --kv-evict score (+12 B per slot of scores, counted)
#   learned far     --kv-window W'-S-F --o1-far linear on the model polished by
#                   `cortiq polish --o1-far linear` (F = the far state's bytes in positions,
#                   rounded up), trained on TRAIN (disjoint from TEXT)
#   score + far     both, the window shrunk by score eviction's 12 B per slot too
# With SPLIT=on (the default) the polish also measures each layer's window curve on TRAIN and
# the polished model carries it: the far-field rows then split the windows by it (the same
# total), and two more rows run sink+window and score eviction split the same way on that model
# with its far field dropped (--o1-far none); --o1-split off on it gives the uniform rows.
# Prints a markdown table per model and context: ppl, ratio to exact, the fraction of
# sink+window's excess closed (1 − (x − exact)/(sw − exact)) and the state bytes each run reports.
#
# Usage: bench/o1_budget.sh [MODEL ...]   (known cortiq names; default: the three)
# Environment: TEXT (lcet10.txt), TRAIN (alice29.txt), CTXS ("2048 4096"), BUDGETS ("128 512"),
# CHUNKS (2), SINKS (4), RANK (16), FAR_STEPS (400), FAR_WINDOWS (8), FAR_CTX (2048),
# FAR_DIR (~/.cache/cortiq/far: polished models, reused when present; each polish's per-layer
# log beside it as MODEL.cmf.log), HEAD_DIM (64; Gemma 3's is
# 256), CORTIQ
# (target/release/cortiq). WRITE=1 appends the tables to BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "o1_budget.sh: $*" >&2; exit 1; }
CORTIQ=${CORTIQ:-target/release/cortiq}
[ -x "$CORTIQ" ] || die "build cortiq first: cargo build --release -p cortiq-cli"
TEXT=${TEXT:-lcet10.txt}; TRAIN=${TRAIN:-alice29.txt}
CTXS=${CTXS:-2048 4096}; BUDGETS=${BUDGETS:-128 512}; CHUNKS=${CHUNKS:-2}; SINKS=${SINKS:-4}
RANK=${RANK:-16}; FAR_STEPS=${FAR_STEPS:-400}; FAR_WINDOWS=${FAR_WINDOWS:-8}; FAR_CTX=${FAR_CTX:-2048}
FAR_DIR=${FAR_DIR:-$HOME/.cache/cortiq/far}; SPLIT=${SPLIT:-on}
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
out "command: CTXS=\"$CTXS\" BUDGETS=\"$BUDGETS\" CHUNKS=$CHUNKS SINKS=$SINKS RANK=$RANK FAR_STEPS=$FAR_STEPS FAR_WINDOWS=$FAR_WINDOWS bench/o1_budget.sh ${MODELS[*]}"
out "text: $TEXT held out (far fields trained on $TRAIN); each chunk: the first half exact (the sealed prompt), the second half scored"
for name in "${MODELS[@]}"; do
    path=$("$CORTIQ" pull "$name")
    # The far state in positions of sink+window: r·(hd+2) vs 2·hd values per KV head.
    case $name in gemma3*) hd=256 nkv=1 ;; qwen2.5*) hd=64 nkv=2 ;; smollm2*) hd=64 nkv=3 ;; *) hd=${HEAD_DIM:-64} nkv=${N_KV:-1} ;; esac
    far_pos=$(awk -v r="$RANK" -v d="$hd" 'BEGIN{x = r * (d + 2) / (2 * d); printf "%d", (x == int(x)) ? x : int(x) + 1}')
    first_budget=${BUDGETS%% *}
    wfar=$((first_budget - SINKS - far_pos))
    far="$FAR_DIR/$name-far-r$RANK-w$wfar$([ "$SPLIT" = on ] && echo -split).cmf"
    if [ ! -f "$far" ]; then
        t0=$(date +%s)
        "$CORTIQ" polish -m "$path" -o "$far" --o1-far linear --o1-window "$wfar" --o1-sinks "$SINKS" --far-rank "$RANK" \
            --ctx "$FAR_CTX" --far-windows "$FAR_WINDOWS" --steps "$FAR_STEPS" --batch 2 --train "$TRAIN" --valid "$TEXT" \
            --o1-split "$SPLIT" > "$far.log" 2>&1 || die "polish failed: $(tail -3 "$far.log")"
        tail -1 "$far.log" | tee -a "$REPORT"
        out "far field of $name: trained in $(( $(date +%s) - t0 ))s (window $wfar, rank $RANK, head_dim $hd: $far_pos positions)"
    fi
    for ctx in $CTXS; do
        read -r exact _ <<<"$(ppl "$path" "$ctx")"
        out
        out "**$name, ctx $ctx**: exact ppl $exact"
        out
        out "| budget W' | policy | flags | ppl | ratio to exact | excess closed | state KiB |"
        out "|---|---|---|---|---|---|---|"
        for b in $BUDGETS; do
            w=$((b - SINKS))
            read -r sw swb <<<"$(ppl "$path" "$ctx" --kv-window "$w" --kv-sinks "$SINKS")"
            out "| $b | sink+window | --kv-window $w | $sw | $(ratio "$sw" "$exact") | 0% | $(kb "$swb") |"
            # Score eviction keeps a position and an f64 score per slot: 12 B, in positions.
            score_pos=$(awk -v b="$b" -v p=$((8 * nkv * hd)) 'BEGIN{x = 12 * b / p; printf "%d", (x == int(x)) ? x : int(x) + 1}')
            ws=$((w - score_pos))
            read -r sc scb <<<"$(ppl "$path" "$ctx" --kv-window "$ws" --kv-sinks "$SINKS" --kv-evict score)"
            out "| $b | score eviction | --kv-window $ws --kv-evict score | $sc | $(ratio "$sc" "$exact") | $(closed "$sc" "$exact" "$sw") | $(kb "$scb") |"
            if [ "$SPLIT" = on ]; then
                read -r sp spb <<<"$(ppl "$far" "$ctx" --kv-window "$w" --kv-sinks "$SINKS" --o1-far none)"
                out "| $b | sink+window, windows split | --kv-window $w --o1-far none (split model) | $sp | $(ratio "$sp" "$exact") | $(closed "$sp" "$exact" "$sw") | $(kb "$spb") |"
                read -r ss ssb <<<"$(ppl "$far" "$ctx" --kv-window "$ws" --kv-sinks "$SINKS" --o1-far none --kv-evict score)"
                out "| $b | score eviction, windows split | --kv-window $ws --o1-far none --kv-evict score (split model) | $ss | $(ratio "$ss" "$exact") | $(closed "$ss" "$exact" "$sw") | $(kb "$ssb") |"
            fi
            wl=$((b - SINKS - far_pos))
            read -r lf lfb <<<"$(ppl "$far" "$ctx" --kv-window "$wl" --kv-sinks "$SINKS" --o1-far linear)"
            out "| $b | learned far field (r $RANK) | --kv-window $wl --o1-far linear | $lf | $(ratio "$lf" "$exact") | $(closed "$lf" "$exact" "$sw") | $(kb "$lfb") |"
            wsl=$((wl - score_pos))
            read -r sl slb <<<"$(ppl "$far" "$ctx" --kv-window "$wsl" --kv-sinks "$SINKS" --o1-far linear --kv-evict score)"
            out "| $b | score eviction + learned far field | --kv-window $wsl --kv-evict score --o1-far linear | $sl | $(ratio "$sl" "$exact") | $(closed "$sl" "$exact" "$sw") | $(kb "$slb") |"
        done
    done
done
if [ "${WRITE:-0}" = 1 ]; then
    { echo; echo "### O(1) at a fixed state budget, $(date -u +%Y-%m-%d)"; echo; cat "$REPORT"; } >> BENCHMARKS.md
    echo "appended to BENCHMARKS.md" >&2
fi
