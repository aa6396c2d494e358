#!/usr/bin/env bash
# One stream through `cortiq serve` against `cortiq run`, same model, prompt, threads and token
# count, alternated ROUNDS times in one run (loopback only): the issue's "single stream through
# the server within 5% of `cortiq run`". Prints each pair and the sums.
#
# usage: bench/serve_single.sh MODEL [CORTIQ=target/release/cortiq] [ROUNDS=3] [TOKENS=256] [THREADS=2] [PORT=18602]
set -euo pipefail
model=${1:?usage: bench/serve_single.sh MODEL [CORTIQ] [ROUNDS] [TOKENS] [THREADS] [PORT]}
cortiq=${2:-target/release/cortiq}
rounds=${3:-3}
tokens=${4:-256}
threads=${5:-2}
port=${6:-18602}
prompt="Write a Python function that checks whether a number is prime."
"$cortiq" serve -m "$model" -t "$threads" --port "$port" --parallel 1 --ctx 2048 >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _ in $(seq 100); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 0.2; done
curl -sf "localhost:$port/health" >/dev/null || { echo "server not healthy" >&2; exit 1; }
body=$(printf '{"prompt":"%s","max_tokens":%d,"temperature":0,"ignore_eos":true}' "$prompt" "$tokens")
run_sum=0; srv_sum=0
for r in $(seq "$rounds"); do
    # `run`'s own report (prompt + decode, the model load left out) against the server's whole
    # request as the client sees it.
    report=$("$cortiq" run -m "$model" -p "$prompt" -n "$tokens" --temp 0 --ignore-eos -t "$threads" 2>&1 >/dev/null | tail -1)
    run_s=$(echo "$report" | sed -E 's/.*prompt [0-9]+ tok in ([0-9.]+)s .*generated [0-9]+ tok in ([0-9.]+)s.*/\1 \2/' | awk '{print $1 + $2}')
    t1=$(date +%s.%N)
    curl -sf "localhost:$port/v1/completions" -H 'content-type: application/json' -d "$body" -o /dev/null
    t2=$(date +%s.%N)
    srv_s=$(python3 -c "print($t2 - $t1)")
    python3 -c "print('round $r: run %.2f s, server %.2f s, ratio %.3f' % ($run_s, $srv_s, $srv_s / $run_s))"
    run_sum=$(python3 -c "print($run_sum + $run_s)"); srv_sum=$(python3 -c "print($srv_sum + $srv_s)")
done
python3 -c "print('sum: run %.2f s, server %.2f s, server / run %.3f' % ($run_sum, $srv_sum, $srv_sum / $run_sum))"
