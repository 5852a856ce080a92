#!/usr/bin/env bash
# On the GPU machine, from the repository root, after
# `OLD_REV=5c1f5aa tools/gpu/bundle.sh`: the figures owed to the H200 since
# the forty-seventh session (BENCHMARKS.md's targets section), in one call
# of about five minutes. On any other GPU it stops at once (ONLY_ON), so a
# call that gets an H100 costs only its start.
# - This build beside 5c1f5aa (the build before the forty-seventh
#   session's carveout 60 and 158 KB int8 ring) on the table's presets.
# - The table's int8/int4 rows at `--quant-group 128` (fifty-second
#   session), and gpt-oss-120b.
# - The streamed int8 ring against the `_qx` kernel
#   (`TURBOSPARK_CUDA_STREAM=0`; +9.8% for the ring on an H100, fifty-third
#   session).
# Results: $OUT/ab.txt and $OUT/knobs.txt, one line a run.
set -u
export ONLY_ON=H200
d=$(dirname "$0")
"$d/ab.sh" 1 "llama-3.1-8b --quant int8" "llama-3.1-8b --quant int4" llama-3.1-8b gpt-oss-20b
BINS=turbospark "$d/ab.sh" 1 "llama-3.1-8b --quant int8 --quant-group 128" \
    "llama-3.1-8b --quant int4 --quant-group 128" gpt-oss-120b
"$d/knobs.sh" 1 "TURBOSPARK_CUDA_STREAM=1 TURBOSPARK_CUDA_STREAM=0" "llama-3.1-8b --quant int8"
