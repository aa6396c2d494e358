#!/usr/bin/env bash
# Matrix products per GGUF weight type, cortiq beside llama.cpp on the same shapes and threads
# (issue 50 point 4): llama.cpp's `test-backend-ops perf -o MUL_MAT -b CPU` (weights 4096 x
# 14336, times n = 1 and n = 512 f32 columns; it runs the CPU backend on hardware_concurrency/2
# threads, 1 on a 2-core machine, with its weights in the plain GGUF layout: no repacking) and
# cortiq's `quant_types_bench` example on the same shapes and thread count, twice: as the engine
# runs a dense matrix (interleaved where the type has the layout: cortiq's counterpart of
# llama.cpp's repacking, which test-backend-ops does not do) and in the plain layout (like for
# like with test-backend-ops). The tools alternate per type. Prints a markdown table of GFLOPS
# and the ratios.
#
# It builds nothing: LLAMACPP_DIR is a llama.cpp build with tests (cmake -DLLAMA_BUILD_TESTS=ON,
# target test-backend-ops; see MODELS.md for the flags), and the example is built with
#   cargo build --release -p cortiq-engine --example quant_types_bench
#
# Usage: LLAMACPP_DIR=/path/to/build bench/quant_types.sh [TYPE ...]   (ggml names; default all)
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "quant_types.sh: $*" >&2; exit 1; }
[ -n "${LLAMACPP_DIR:-}" ] || die "set LLAMACPP_DIR to a llama.cpp build directory with test-backend-ops"
TBO="$LLAMACPP_DIR/bin/test-backend-ops"; [ -x "$TBO" ] || die "no $TBO (build the test-backend-ops target)"
EX="${CARGO_TARGET_DIR:-target}/release/examples/quant_types_bench"
[ -x "$EX" ] || die "build the example first: cargo build --release -p cortiq-engine --example quant_types_bench"
export LD_LIBRARY_PATH="$LLAMACPP_DIR/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TYPES=("$@")
[ ${#TYPES[@]} -gt 0 ] || TYPES=(q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K q4_K q5_K q6_K iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq4_nl iq4_xs mxfp4)
T=$(( $(nproc) / 2 )); [ "$T" -ge 1 ] || T=1   # test-backend-ops' own thread count

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; threads $T; ${CORTIQ_SIMD:+CORTIQ_SIMD=$CORTIQ_SIMD; }$(date -u +%Y-%m-%dT%H:%MZ)"
echo "command: ${CORTIQ_SIMD:+CORTIQ_SIMD=$CORTIQ_SIMD }LLAMACPP_DIR=$LLAMACPP_DIR bench/quant_types.sh ${TYPES[*]}"
echo
echo "| type | llama.cpp n=1 | cortiq n=1 (plain) | ratio (plain) | llama.cpp n=512 | cortiq n=512 (plain) | ratio (plain) |"
echo "|---|---|---|---|---|---|---|"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", b / a; else printf "—" }'; }
for ty in "${TYPES[@]}"; do
    declare -A L=() C=() P=()
    for n in 1 512; do
        # GFLOPS from "MUL_MAT(type_a=TY,...,n=N,k=14336,...): R runs - U us/run - F MFLOP/run - G GFLOPS"
        line=$("$TBO" perf -o MUL_MAT -b CPU -p "type_a=$ty,type_b=f32,m=4096,n=$n,k=14336" 2>/dev/null | grep -F "MUL_MAT(type_a=$ty," | head -1 || true)
        L[$n]=$(sed 's/\x1b\[[0-9;]*m//g' <<<"$line" | awk '{for (i = 1; i <= NF; i++) if ($i == "GFLOPS" || $i == "TFLOPS") { v = $(i-1); if ($i == "TFLOPS") v *= 1000; print v }}')
    done
    out=$("$EX" "$T" 1,512 "$ty")
    plain=$("$EX" "$T" 1,512 "$ty" plain)
    for n in 1 512; do
        C[$n]=$(awk -v k="$ty n=$n:" 'index($0, k) == 1 {print $3}' <<<"$out")
        P[$n]=$(awk -v k="$ty n=$n:" 'index($0, k) == 1 {print $3}' <<<"$plain")
    done
    echo "| $ty | ${L[1]:-—} | ${C[1]:-—} (${P[1]:-—}) | $(ratio "${L[1]:-0}" "${C[1]:-0}") ($(ratio "${L[1]:-0}" "${P[1]:-0}")) | ${L[512]:-—} | ${C[512]:-—} (${P[512]:-—}) | $(ratio "${L[512]:-0}" "${C[512]:-0}") ($(ratio "${L[512]:-0}" "${P[512]:-0}")) |"
    unset L C P
done
