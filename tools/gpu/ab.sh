#!/usr/bin/env bash
# On the GPU machine, from the repository root, after
# `OLD_REV=<rev> tools/gpu/bundle.sh`: decode and prefill of the old build
# (.device/turbospark_old) and this one (.device/turbospark) alternated in
# separate processes, REPS rounds, for each preset given, e.g.
#   .device/ab.sh 2 "llama-3.1-8b --quant int4" gpt-oss-20b
# Each call of the device tool starts a fresh machine, on which the same
# binary measures differently, so only figures of one call compare.
# One line a run, as it ends, to $OUT/ab.txt (default ./gpu-results),
# with the recorded step's census where the build reports it.
# PROMPT_LEN and GEN_LEN (default 2048 and 128) set the bench's lengths:
# GEN_LEN=16 for prefill alone costs about a third of the time.
# BINS (default "turbospark_old turbospark") names the builds to
# alternate, e.g. those `PATCHES=... tools/gpu/bundle.sh` made; an entry
# VAR=VALUE@NAME runs build NAME with VAR set (one knob of one build;
# VAR=a,OTHER=b@NAME sets several).
# A knob of one build (no OLD_REV build needed): knobs.sh.
. "$(dirname "$0")/common.sh"
reps=$1
shift
for p in "$@"; do
    for _ in $(seq "$reps"); do
        for b in ${BINS:-turbospark_old turbospark}; do
            # An entry VAR=VALUE@NAME runs build NAME with VAR set.
            envs="" bin=$b
            case $b in *@*) envs=${b%@*} bin=${b#*@} ;; esac
            envs=${envs//,/ }  # VAR=a,OTHER=b@NAME: several settings
            # shellcheck disable=SC2086 # the preset carries its flags, envs its setting
            line=$(timeout 200 env $envs ".device/$bin" bench --device cuda --json --synthetic $p \
                --prompt-len "${PROMPT_LEN:-2048}" --gen-len "${GEN_LEN:-128}" 2>/dev/null | tail -1)
            bench_line "$b" "$p" "$line"
        done
    done
done | tee -a "$OUT/ab.txt"
