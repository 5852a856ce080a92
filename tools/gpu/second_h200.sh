#!/usr/bin/env bash
# On the GPU machine, from the repository root, after
# `OLD_REV=5c1f5aa tools/gpu/bundle.sh`: a second look at the H200 after
# owed_h200.sh's call (sixty-third session), about three minutes. On any
# other GPU it stops at once.
# - The missed rows at the default one scale a 32 values beside one a 128
#   (and int4 at 256), alternated preset by preset in separate processes,
#   two rounds: owed_h200.sh ran each once, and 128 gained far less there
#   than on an H100.
# - bf16 Llama and Qwen3-30B-A3B once (Qwen3's row was last measured in
#   the thirty-eighth session).
# - gpt-oss-20b, this build against 5c1f5aa's (carveout 50), two rounds:
#   owed_h200.sh's one round gave this build's prefill 25,441 tok/s
#   against 28,754, and the carveout reaches the MoE prefill's kernels.
# Results: $OUT/ab.txt, one line a run.
set -u
export ONLY_ON=H200
d=$(dirname "$0")
q8="llama-3.1-8b --quant int8" q4="llama-3.1-8b --quant int4"
BINS=turbospark "$d/ab.sh" 1 "$q8" "$q8 --quant-group 128" "$q4" "$q4 --quant-group 128" \
    "$q8" "$q8 --quant-group 128" "$q4" "$q4 --quant-group 128" \
    "$q4 --quant-group 256" llama-3.1-8b qwen3-30b-a3b
"$d/ab.sh" 2 gpt-oss-20b
