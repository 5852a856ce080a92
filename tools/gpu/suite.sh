#!/usr/bin/env bash
# On the GPU machine, from the repository root, after tools/gpu/bundle.sh:
# the GPU tests, the decode/prefill bench of BENCHMARKS.md's table, and a
# per-kernel Nsight Compute table of steady-state decode (warm caches, the
# GPU's own clocks). Results go to $OUT (default ./gpu-results).
# PREFILL=0 leaves out the per-kernel table of a prefill, NCU=0 those of
# decode.
# SANITIZE=1 also runs compute-sanitizer memcheck on the parity tests (those
# matching PARITY_FILTER's names, if set) and short gpt-oss and int4 Llama
# decodes.
. "$(dirname "$0")/common.sh"
D=.device
for t in parity parity_kv parity_step parity_linear parity_moe sampling flash_attention fixtures_on_gpu memory; do
    echo "=== $t"
    timeout 300 "$D/$t" 2>&1 | grep -v "^$" | tail -40
done > "$OUT/tests.txt" 2>&1
grep -E "test result|FAILED|panicked" "$OUT/tests.txt"

B="$D/turbospark bench --device cuda --json"
for p in "llama-3.1-8b" "llama-3.1-8b --quant int8" "llama-3.1-8b --quant int4" "gpt-oss-20b"; do
    # shellcheck disable=SC2086 # the preset carries its flags
    timeout 200 $B --synthetic $p --prompt-len 2048 --gen-len 128 2>&1 | tail -1
done > "$OUT/bench.txt"
python3 - "$OUT/bench.txt" <<'PY' | tee "$OUT/bench_summary.txt"
import json, sys
for line in open(sys.argv[1]):
    try:
        d = json.loads(line)
        g = d.get("decode_graph_nodes")  # builds before deb9c12 lack it
        census = " | graph %d kernels, %d of %d edges programmatic" % (
            g["kernels"], g["programmatic_edges"], g["edges"]) if g else ""
        print(d["model"], d["quant"], "prefill %.0f decode %.1f ceiling %.3f peak %.1f GB%s" % (
            d["prefill_tok_s"], d["decode_tok_s"], d["ceiling_fraction"], d["peak_gpu_bytes"] / 1e9,
            census))
    except ValueError:
        print(line[:300])
PY

M="--cache-control none --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,smsp__inst_executed.sum"
[ "${NCU:-1}" = 1 ] && for p in "llama-3.1-8b --quant int4" "gpt-oss-20b" "llama-3.1-8b"; do
    echo "=== $p (2 layers, the last kernels launched: steady-state decode)"
    # shellcheck disable=SC2086
    timeout 200 ncu --csv $M --launch-count 700 $B --synthetic $p --layers 2 --prompt-len 2048 --gen-len 12 --warmup 0 2>/dev/null \
        | python3 "$D/ncu_table.py" 30
done > "$OUT/kernels.txt" 2>&1

[ "${PREFILL:-1}" = 1 ] && for p in "llama-3.1-8b" "gpt-oss-20b"; do
    echo "=== prefill $p (2 layers, 2048 tokens, no warmup: ncu times kernels, not loading)"
    # shellcheck disable=SC2086
    timeout 200 ncu --csv $M $B --synthetic $p --layers 2 --prompt-len 2048 --gen-len 1 --warmup 0 2>/dev/null \
        | python3 "$D/ncu_table.py" sum | head -25
done > "$OUT/prefill_kernels.txt" 2>&1

if [ "${SANITIZE:-0}" = 1 ]; then
    # shellcheck disable=SC2086 # PARITY_FILTER is a list of test-name filters
    { for t in parity parity_kv parity_step parity_linear parity_moe sampling; do
          timeout 600 compute-sanitizer --tool memcheck "$D/$t" --test-threads=1 ${PARITY_FILTER:-} 2>&1 | tail -4
      done
      for p in "gpt-oss-20b" "llama-3.1-8b --quant int4"; do
          timeout 300 compute-sanitizer --tool memcheck $B --synthetic $p --layers 2 --prompt-len 64 --gen-len 4 2>&1 | tail -2
      done
    } > "$OUT/memcheck.txt"
    grep "ERROR SUMMARY" "$OUT/memcheck.txt"
fi
