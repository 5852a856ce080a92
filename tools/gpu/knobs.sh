#!/usr/bin/env bash
# On the GPU machine, from the repository root, after tools/gpu/bundle.sh:
# one build's decode and prefill under each setting of a knob, alternated
# in separate processes, REPS rounds, for each preset given, e.g.
#   .device/knobs.sh 2 "TURBOSPARK_CUDA_ROUTE_TICKET=0 TURBOSPARK_CUDA_ROUTE_TICKET=1" gpt-oss-20b
# (ab.sh compares two builds instead). One line a run, as it
# ends, to $OUT/knobs.txt (default ./gpu-results); PROMPT_LEN and GEN_LEN
# (default 2048 and 128) set the bench's lengths.
. "$(dirname "$0")/common.sh"
reps=$1
settings=$2
shift 2
for p in "$@"; do
    for _ in $(seq "$reps"); do
        for s in $settings; do
            # shellcheck disable=SC2086 # the preset carries its flags
            line=$(timeout 200 env "$s" .device/turbospark bench --device cuda --json --synthetic $p \
                --prompt-len "${PROMPT_LEN:-2048}" --gen-len "${GEN_LEN:-128}" 2>/dev/null | tail -1)
            bench_line "$s" "$p" "$line"
        done
    done
done | tee -a "$OUT/knobs.txt"
