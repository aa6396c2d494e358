#!/usr/bin/env bash
# Long-range recall at a fixed state budget (issue 15): a five-digit pass key stated once early in
# a filler text of LEN tokens, asked for at the end; greedy decode of 8 tokens; a trial counts
# when the key's digits appear in the answer. Every policy holds at most the bytes of sink+window
# W' = BUDGET positions, sinks included (`--o1-budget BUDGET-SINKS`, as bench/o1_budget.sh); exact
# attention beside them. The prompt is the sealed part (the question comes last), so the key is
# far from the window when decoding starts. "score eviction, voted seal" lets the prompt's last
# OBS queries (the question) choose the prompt keys kept at the seal (SnapKV).
#
# Usage: bench/passkey.sh MODEL [FAR.cmf]   (MODEL: a known name or a path; FAR: the model polished with `--o1-far linear`;
#        without it the learned-far rows are skipped)
# Environment: LENS ("2048 4096", in filler sentences x 10 ≈ tokens), TRIALS (50), BUDGET (128),
# SINKS (4), OBS (16), FIRST (the first trial's number, 1: FIRST=11 TRIALS=40 runs trials 11-50,
# the keys and depths of a 50-trial run's last 40), CTX (the context each run gets, 8192: a LEN of 4096 is ~4.9k tokens), CORTIQ, ONLY (a comma-separated list of row names to run, e.g.
# "exact,sink+window,--o1"; default all), NUMERICS (exact; or `fast`, the quantized
# kernels users run, for the long prompts). Prints a markdown table: retrieval rate per policy and
# length; each trial's result goes to stderr as it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "passkey.sh: $*" >&2; exit 1; }
CORTIQ=${CORTIQ:-target/release/cortiq}
[ -x "$CORTIQ" ] || die "build cortiq first: cargo build --release -p cortiq-cli"
[ $# -ge 1 ] || die "usage: bench/passkey.sh MODEL [FAR.cmf]"
if [ -e "$1" ]; then MODEL=$1; else MODEL=$("$CORTIQ" pull "$1"); fi; FAR=${2:-}
LENS=${LENS:-2048 4096}; TRIALS=${TRIALS:-50}; BUDGET=${BUDGET:-128}; SINKS=${SINKS:-4}
OBS=${OBS:-16}; FIRST=${FIRST:-1}; CTX=${CTX:-8192}; NUMERICS=${NUMERICS:-exact}
b="--o1-budget $((BUDGET - SINKS)) --kv-sinks $SINKS"
policies=("exact||$MODEL" "sink+window|$b|$MODEL" "score eviction|$b --kv-evict score|$MODEL"
    "score eviction, voted seal|$b --kv-evict score --kv-evict-obs $OBS|$MODEL")
if [ -n "$FAR" ]; then
    policies+=("learned far field, windows split|$b --o1-far linear|$FAR" "score + far field, windows split|$b --kv-evict score --o1-far linear|$FAR"
        "score (voted seal) + far field, windows split|$b --kv-evict score --kv-evict-obs $OBS --o1-far linear|$FAR"
        "--o1|$b --o1|$FAR")
fi
ONLY=${ONLY:-}
filler="The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
# prompt LEN KEY SEED: the key's sentence at a seeded depth in the first quarter.
prompt() {
    local n=$(( $1 / 20 )) key=$2 seed=$3 at i out=""
    at=$(( 1 + seed * 7919 % (n / 4 + 1) ))
    out="There is a pass key hidden in a lot of irrelevant text. Find it and remember it. "
    for ((i = 0; i < n; i++)); do
        [ "$i" -eq "$at" ] && out+="The pass key is $key. Remember it. $key is the pass key. "
        out+=$filler
    done
    printf '%sWhat is the pass key? The pass key is' "$out"
}
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
echo "command: LENS=\"$LENS\" FIRST=$FIRST TRIALS=$TRIALS BUDGET=$BUDGET bench/passkey.sh $* ; greedy, 8 tokens, $NUMERICS numerics"
echo
echo "| policy | flags | $(for l in $LENS; do printf '~%s tokens | ' "$l"; done)"
echo "|---|---|$(for _ in $LENS; do printf -- '---|'; done)"
for p in "${policies[@]}"; do
    IFS='|' read -r name flags m <<<"$p"
    [ -z "$ONLY" ] || [[ ",$ONLY," == *",$name,"* ]] || continue
    row="| $name | ${flags:--} |"
    for len in $LENS; do
        hit=0
        for ((s = FIRST; s < FIRST + TRIALS; s++)); do
            key=$(( 10000 + (s * 48271) % 90000 ))
            # shellcheck disable=SC2086
            ans=$("$CORTIQ" run -m "$m" -p "$(prompt "$len" "$key" "$s")" -n 8 --temp 0 --numerics "$NUMERICS" --ctx "$CTX" $flags 2>/dev/null) || die "run failed: $name (rerun one trial by hand to see why)"
            if [[ "$ans" == *"$key"* ]]; then hit=$((hit + 1)); r=found; else r="missed (${ans//$'\n'/ })"; fi
            echo "$name, ~$len, trial $s (key $key): $r; $hit so far" >&2
        done
        row+=" $hit/$TRIALS |"
    done
    echo "$row"
done
