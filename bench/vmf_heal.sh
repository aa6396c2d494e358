#!/usr/bin/env bash
# Dense to hybrid on cortiq's vmf_phase core (issue 16): fold a fraction of a model's attention
# layers (`convert --linear-core vmf_phase --layers auto:F`), heal it (stage 1, attention
# transfer; stage 2, KL against the original), and report held-out perplexity (lcet10.txt; the
# training texts are alice29 + asyoulik, the held-out windows of the polish plrabn12) after each
# step beside the original's (with `--kl-base`: the KL against the original and the top-1
# agreement), then the healed hybrid with its f32 matrices stored in 8 bits (`convert --f32-as
# q8r`) and decode at depth beside the original (tg32 at d8192; KV / recurrent state bytes).
#
# Usage: bench/vmf_heal.sh [MODEL] [F]     (default smollm2-135m, 0.25)
# Environment: OUT (work folder, default /tmp/vmf_heal), CTX (512), S1_STEPS (300), S1_WINDOWS (32),
# S2_STEPS (150), S2_LR (5e-5), S2_CTX (stage 2's window, default CTX), ALSO_CTX (also report
# the healed hybrid at this shorter window over the same text, e.g. 512: is the gap length?), PPL_CTX (1024), PPL_CHUNKS (4), CORTIQ,
# TRAIN (training texts, default "alice29.txt asyoulik.txt"), VALID (the polish's held-out windows,
# default plrabn12.txt). `TRAIN=big` trains on alice29 + asyoulik + the first 400,000 bytes of
# plrabn12 and validates on the rest of plrabn12 (written to OUT); lcet10 is never trained on.
# `TRAIN=tech` is `big` plus technical prose from two Debian packages (MODELS.md's texts;
# `apt-get download`): the first 800,000 bytes of the Jargon File's chapters and lexicon
# (jargon-text) and the first 600,000 bytes of the Debian Reference (debian-reference-en); its
# held-out windows are the Reference's next 200,000 bytes. FROM_S1=FILE.cmf starts at stage 2
# from a stage-1 model of an earlier run (the fold and stage 1 are skipped).
# Writes its log lines to stdout (markdown-ready); the .cmf files stay in OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
CORTIQ=${CORTIQ:-target/release/cortiq}
[ -x "$CORTIQ" ] || { echo "build cortiq first: cargo build --release -p cortiq-cli" >&2; exit 1; }
MODEL=${1:-smollm2-135m}; F=${2:-0.25}
OUT=${OUT:-/tmp/vmf_heal}; CTX=${CTX:-512}; S1_STEPS=${S1_STEPS:-300}; S2_STEPS=${S2_STEPS:-150}
S2_LR=${S2_LR:-5e-5}; S2_CTX=${S2_CTX:-$CTX}; S1_WINDOWS=${S1_WINDOWS:-32}; PPL_CTX=${PPL_CTX:-1024}; PPL_CHUNKS=${PPL_CHUNKS:-4}
mkdir -p "$OUT"
TRAIN=${TRAIN:-alice29.txt asyoulik.txt}; VALID=${VALID:-plrabn12.txt}
if [ "$TRAIN" = big ]; then
    "$CORTIQ" ppl -m "$MODEL" -f plrabn12.txt -c 64 --chunks 1 >/dev/null 2>&1 || true  # pulls the text
    plr=${CORTIQ_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cortiq}/texts/plrabn12.txt
    head -c 400000 "$plr" >"$OUT/plrabn12-head.txt"; tail -c +400001 "$plr" >"$OUT/plrabn12-tail.txt"
    TRAIN="alice29.txt asyoulik.txt $OUT/plrabn12-head.txt"; VALID="$OUT/plrabn12-tail.txt"
fi
if [ "$TRAIN" = tech ]; then
    "$CORTIQ" ppl -m "$MODEL" -f plrabn12.txt -c 64 --chunks 1 >/dev/null 2>&1 || true
    plr=${CORTIQ_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cortiq}/texts/plrabn12.txt
    head -c 400000 "$plr" >"$OUT/plrabn12-head.txt"
    deb="$OUT/deb"; mkdir -p "$deb"
    (cd "$deb" && apt-get download jargon-text=4.4.7-4.1 debian-reference-en=2.100 >/dev/null 2>&1) \
        || { echo "TRAIN=tech needs apt-get download of jargon-text 4.4.7-4.1 and debian-reference-en 2.100" >&2; exit 1; }
    for d in "$deb"/*.deb; do dpkg-deb -x "$d" "$deb/x"; done
    zcat "$deb/x/usr/share/doc/jargon-text/jargon.txt.gz" >"$deb/jargon-all.txt"
    # The chapters (from "Chapter 1.", spaced with no-break spaces) and the lexicon's entries
    # (from the first ":term:"); the index of terms between them is one word per line.
    { sed -n '/^Chapter.*1\..*Hacker Slang/,/^Glossary$/p' "$deb/jargon-all.txt" | sed '$d'
      sed -n '/^   :/,$p' "$deb/jargon-all.txt"; } >"$deb/jargon-body.txt"
    zcat "$deb/x/usr/share/debian-reference/debian-reference.en.txt.gz" | sed -n '/^1\. Disclaimer$/,$p' >"$deb/debref-all.txt"
    # (files, not pipes into head: under pipefail a reader that stops early fails the writer;
    # iconv -c drops the UTF-8 sequence a byte cut may split)
    cut_utf8() { head -c "$2" "$1" >"$1.cut"; iconv -f UTF-8 -t UTF-8 -c "$1.cut" >"$3"; }
    cut_utf8 "$deb/jargon-body.txt" 800000 "$OUT/jargon.txt"
    cut_utf8 "$deb/debref-all.txt" 600000 "$OUT/debref.txt"
    tail -c +600001 "$deb/debref-all.txt" >"$deb/debref-rest.txt"; cut_utf8 "$deb/debref-rest.txt" 200000 "$OUT/debref-valid.txt"
    TRAIN="alice29.txt asyoulik.txt $OUT/plrabn12-head.txt $OUT/jargon.txt $OUT/debref.txt"; VALID="$OUT/debref-valid.txt"
fi
read -ra train_files <<<"$TRAIN"
train=(--train "${train_files[@]}" --valid "$VALID")
echo "training texts: $TRAIN; held-out windows of the polish: $VALID"
ppl() { "$CORTIQ" ppl -m "$1" -f lcet10.txt -c "${2:-$PPL_CTX}" --chunks "${3:-$PPL_CHUNKS}" 2>/dev/null | sed -n 's/^PPL = \([0-9.]*\).*/\1/p'; }
kl() {
    local c=${2:-$PPL_CTX} n=${3:-$PPL_CHUNKS}
    "$CORTIQ" ppl -m "$1" --kl-base "$MODEL" -f lcet10.txt -c "$c" --chunks "$n" 2>/dev/null \
        | sed -n 's/^PPL = \([0-9.]*\).*/ppl \1/p; s/^KL(base || model) = \([0-9.]*\).*/KL \1/p; s/^top-1 agreement = /top-1 /p' | paste -sd, -
}
stamp() { date -u +%s; }
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
base=$(ppl "$MODEL"); echo "original: ppl $base (lcet10, ctx $PPL_CTX, $PPL_CHUNKS chunks)"
if [ -n "${FROM_S1:-}" ]; then
    cp "$FROM_S1" "$OUT/s1.cmf"; echo "stage 1: from $FROM_S1, $(kl "$OUT/s1.cmf")"
else
t=$(stamp)
"$CORTIQ" convert -m "$MODEL" -o "$OUT/fold.cmf" --linear-core vmf_phase --layers "auto:$F" --force 2>&1 | grep -E "converting|fold relative"
echo "fold: $(( $(stamp) - t )) s, $(kl "$OUT/fold.cmf")"
t=$(stamp)
"$CORTIQ" polish -m "$OUT/fold.cmf" --teacher "$MODEL" -o "$OUT/s1.cmf" --stage transfer "${train[@]}" --ctx "$CTX" \
    --far-windows "$S1_WINDOWS" --steps "$S1_STEPS" --batch 4 --lr 2e-3 --valid-every 25 --force 2>&1 | grep -E "held-out relative|wrote"
echo "stage 1: $(( $(stamp) - t )) s, $(kl "$OUT/s1.cmf")"
fi
t=$(stamp)
"$CORTIQ" polish -m "$OUT/s1.cmf" --teacher "$MODEL" -o "$OUT/s2.cmf" --stage distill "${train[@]}" --ctx "$S2_CTX" \
    --batch 2 --steps "$S2_STEPS" --lr "$S2_LR" --warmup 10 --kl-weight 1.0 --valid-every 15 --valid-windows 2 --force 2>&1 \
    | grep -E "^valid|^polished"
echo "stage 2: $(( $(stamp) - t )) s, $(kl "$OUT/s2.cmf")"
if [ -n "${ALSO_CTX:-}" ]; then
    also_chunks=$(( PPL_CHUNKS * PPL_CTX / ALSO_CTX ))
    echo "at ctx $ALSO_CTX ($also_chunks chunks): original ppl $(ppl "$MODEL" "$ALSO_CTX" "$also_chunks"), stage 2 $(kl "$OUT/s2.cmf" "$ALSO_CTX" "$also_chunks")"
fi
"$CORTIQ" convert -m "$OUT/s2.cmf" -o "$OUT/s2-q8.cmf" --f32-as q8r --force >/dev/null 2>&1
echo "stage 2, f32 matrices as q8r: $(kl "$OUT/s2-q8.cmf")"
for m in "$MODEL" "$OUT/s2-q8.cmf" "$MODEL" "$OUT/s2-q8.cmf"; do
    "$CORTIQ" bench -m "$m" -d 8192 -p 0 -n 32 2>&1 | grep -E "^tg|^state" | sed "s|^|$(basename "$m"): |"
done
