#!/usr/bin/env bash
# Reference figures from an EXISTING llama.cpp build, for side-by-side comparison with cortiq on
# the same GGUF files and text: speed (llama-bench), perplexity (llama-perplexity), greedy text
# (llama-simple, else llama-cli) and tokenization (llama-tokenize). It builds nothing.
#
# Usage:
#   LLAMACPP_DIR=/path/to/llama.cpp/build bench/llamacpp.sh [MODEL.gguf ...]
# With no MODEL, runs the three known models from the cortiq cache (`cortiq pull NAME` first).
#
# Environment:
#   LLAMACPP_DIR  required; a build dir holding bin/llama-bench etc. (or the binaries directly)
#   OUT           where raw outputs go (default: ./llamacpp-results)
#   TEXT          perplexity text (default: alice29.txt from the cortiq cache)
#   THREADS       threads for bench and perplexity (default: 2)
#   PROMPT        greedy prompt (default: "The capital of France is")
#
# Per model STEM (file name without .gguf) it writes, under $OUT:
#   STEM.bench.md          llama-bench -t T -p 512 -n 128 -r 3 (pp512 / tg128 tok/s)
#   STEM.ppl.log           llama-perplexity -f TEXT -c 512 -b 512 --chunks 8 (Final estimate line)
#   STEM.greedy.txt        32 greedy tokens after PROMPT (--temp 0), generated text only
#   STEM.tok-prompt.txt    token ids of PROMPT (with the model's BOS rule), one JSON list
#   STEM.tok-text2000.txt  token ids of the first 2000 characters of TEXT (+ .pieces.txt)
# and prints a summary. Build llama.cpp with AMX off on GCC 12 (see shared/MODELS.md).
set -euo pipefail

die() { echo "llamacpp.sh: $*" >&2; exit 1; }

[ -n "${LLAMACPP_DIR:-}" ] || die "set LLAMACPP_DIR to an existing llama.cpp build directory"
bin_of() {
    local b
    for b in "$LLAMACPP_DIR/bin/$1" "$LLAMACPP_DIR/$1"; do
        [ -x "$b" ] && { echo "$b"; return 0; }
    done
    return 1
}
BENCH=$(bin_of llama-bench) || die "no llama-bench under $LLAMACPP_DIR"
PPL=$(bin_of llama-perplexity) || die "no llama-perplexity under $LLAMACPP_DIR"
TOKENIZE=$(bin_of llama-tokenize) || die "no llama-tokenize under $LLAMACPP_DIR"
SIMPLE=$(bin_of llama-simple) || SIMPLE=""
CLI=$(bin_of llama-cli) || CLI=""
[ -n "$SIMPLE$CLI" ] || die "neither llama-simple nor llama-cli under $LLAMACPP_DIR"

# Same precedence as cortiq's cache_dir(): $CORTIQ_CACHE, $XDG_CACHE_HOME/cortiq, ~/.cache/cortiq.
if [ -n "${CORTIQ_CACHE:-}" ]; then CACHE=$CORTIQ_CACHE
elif [[ "${XDG_CACHE_HOME:-}" == /* ]]; then CACHE=$XDG_CACHE_HOME/cortiq
else CACHE=$HOME/.cache/cortiq; fi

OUT=${OUT:-./llamacpp-results}
TEXT=${TEXT:-$CACHE/texts/alice29.txt}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-"The capital of France is"}
[ -f "$TEXT" ] || die "$TEXT not found (run: cortiq pull alice29.txt, or set TEXT)"

if [ $# -eq 0 ]; then
    set -- "$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf" \
           "$CACHE/models/gemma-3-270m-q4_k_m.gguf" \
           "$CACHE/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
fi
for m in "$@"; do [ -f "$m" ] || die "$m: no such model file (run: cortiq pull NAME)"; done

mkdir -p "$OUT"
# First 2000 characters of the text, byte-exact (the Canterbury texts are ASCII, CRLF kept).
TEXT2000="$OUT/$(basename "$TEXT" .txt).first2000.txt"
python3 -c 'import sys; d=open(sys.argv[1],encoding="utf-8",newline="").read()[:2000]; open(sys.argv[2],"w",encoding="utf-8",newline="").write(d)' "$TEXT" "$TEXT2000"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -srm); $(nproc) cpus; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "llama.cpp: $("$BENCH" --version 2>&1 | grep -m1 -i version || true)"
    echo "threads: $THREADS; text: $TEXT ($(wc -c < "$TEXT") bytes)"
} > "$OUT/env.txt"

summary="$OUT/summary.md"
{
    echo "# llama.cpp reference figures"
    sed 's/^/    /' "$OUT/env.txt"
    echo
} > "$summary"

for MODEL in "$@"; do
    STEM=$(basename "$MODEL" .gguf)
    echo "== $STEM" >&2

    # Token ids. --no-escape: the text must reach the tokenizer byte for byte.
    "$TOKENIZE" -m "$MODEL" -p "$PROMPT" --ids --log-disable > "$OUT/$STEM.tok-prompt.txt" 2> "$OUT/$STEM.tok.log"
    "$TOKENIZE" -m "$MODEL" -f "$TEXT2000" --no-escape --ids --log-disable > "$OUT/$STEM.tok-text2000.txt" 2>> "$OUT/$STEM.tok.log"
    # The same as `id -> 'piece'` lines, for reading a divergence by eye.
    "$TOKENIZE" -m "$MODEL" -f "$TEXT2000" --no-escape --log-disable > "$OUT/$STEM.tok-text2000.pieces.txt" 2>> "$OUT/$STEM.tok.log"

    # Greedy continuation, deterministic: temperature 0 == argmax.
    if [ -n "$SIMPLE" ]; then
        # llama-simple samples greedily and echoes the prompt before the continuation.
        "$SIMPLE" -m "$MODEL" -n 32 "$PROMPT" > "$OUT/$STEM.greedy.raw" 2> "$OUT/$STEM.greedy.log"
    else
        "$CLI" -m "$MODEL" -n 32 --temp 0 -t "$THREADS" -no-cnv -p "$PROMPT" \
            > "$OUT/$STEM.greedy.raw" 2> "$OUT/$STEM.greedy.log"
    fi
    python3 - "$OUT/$STEM.greedy.raw" "$PROMPT" > "$OUT/$STEM.greedy.txt" <<'EOF'
import sys
raw = open(sys.argv[1], encoding="utf-8", errors="replace").read()
# Both tools echo the prompt, then the continuation, then one newline of their own.
i = raw.find(sys.argv[2])
text = raw[i + len(sys.argv[2]):] if i >= 0 else raw
print(repr(text[:-1] if text.endswith("\n") else text))
EOF

    "$PPL" -m "$MODEL" -f "$TEXT" -c 512 -b 512 --chunks 8 -t "$THREADS" > "$OUT/$STEM.ppl.log" 2>&1
    "$BENCH" -m "$MODEL" -t "$THREADS" -p 512 -n 128 -r 3 > "$OUT/$STEM.bench.md" 2> "$OUT/$STEM.bench.log"

    {
        echo "## $STEM"
        echo "- perplexity ($(basename "$TEXT"), c 512, 8 chunks): $(grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' "$OUT/$STEM.ppl.log" | sed 's/Final estimate: PPL = //')"
        echo "- greedy \"$PROMPT\" -> $(cat "$OUT/$STEM.greedy.txt")"
        echo "- prompt ids: $(cat "$OUT/$STEM.tok-prompt.txt")"
        echo "- ids of first 2000 chars: $(tr -cd ',' < "$OUT/$STEM.tok-text2000.txt" | wc -c | awk '{print $1+1}') tokens"
        echo
        grep '^|' "$OUT/$STEM.bench.md"
        echo
    } >> "$summary"
done
cat "$summary"
