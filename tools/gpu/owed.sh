#!/usr/bin/env bash
# On the GPU machine, from the repository root, after tools/gpu/bundle.sh:
# the figures the sessions without a GPU left owed (BENCHMARKS.md's "For the
# next GPU session" lines), in one call of about a minute (54 s on
# 2026-12-05):
# - the rows of BENCHMARKS.md's table no GPU has measured since the CPU's
#   changes to the shared loader: gpt-oss-20b with `--quant int8|int4` (the
#   analogue of llama.cpp's Q8_0-rest GGUF, 324.1 tok/s on this GPU) and
#   Llama-3.2-1B `--quant int8` (a tied head, quantized since the
#   thirty-ninth session), beside this build's gpt-oss-20b and Llama-8B int8;
# - the demo model's perplexity on the GPU through the prompt path and the
#   decode path (`perplexity --decode`: the `_qx` GEMVs' rounded x), shipped,
#   int8 and int4, beside the CPU's figures in BENCHMARKS.md's Quality table.
# Run .device/suite.sh (PREFILL=0 NCU=0) in the same call for the tests.
# Results: $OUT/owed_bench.txt, $OUT/owed_perplexity.txt.
. "$(dirname "$0")/common.sh"
B=".device/turbospark bench --device cuda --json --prompt-len 2048 --gen-len 128"
for p in "gpt-oss-20b" "gpt-oss-20b --quant int8" "gpt-oss-20b --quant int4" \
    "llama-3.1-8b --quant int8" "llama-3.2-1b --quant int8" "llama-3.2-1b"; do
    # shellcheck disable=SC2086 # the preset carries its flags
    line=$(timeout 240 $B --synthetic $p 2>/dev/null | tail -1)
    bench_line owed "$p" "$line"
done | tee "$OUT/owed_bench.txt"

P=".device/turbospark perplexity --device cuda --text-file tools/train-demo/corpus/valid.txt --context 512 --json"
for q in "" "--quant int8" "--quant int4"; do
    for path in "" "--decode"; do
        # shellcheck disable=SC2086 # the flags are words
        echo "${q:-shipped} ${path:-prompt}: $(timeout 240 $P $q $path 2>&1 | tail -1)"
    done
done | tee "$OUT/owed_perplexity.txt"
