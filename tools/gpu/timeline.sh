#!/usr/bin/env bash
# On the GPU machine, from the repository root, after tools/gpu/bundle.sh:
# a decode step's timeline as the GPU ran it (src/trace.rs), e.g.
#   .device/timeline.sh int4 --synthetic llama-3.1-8b --quant int4 --layers 8
# runs `turbospark bench --device cuda --json --prompt-len 2048 --gen-len 16
# ARGS...` with TURBOSPARK_CUDA_TRACE set, then tools/gpu/timeline.py on
# what it wrote: $OUT/timeline_NAME.txt (the bench's figures, then the
# table), and with RAW=1 the raw timeline gzipped (raw_NAME.txt.gz) for
# another look here. BIN names another build of .device/ (default
# turbospark, e.g. one `PATCHES=` made); GAP_US is timeline.py's --gap-us
# (default 50: a launch's phases later than that after its last wait are
# left out).
bin=.device/${BIN:-turbospark}
. "$(dirname "$0")/common.sh"
name=$1
shift
raw=/tmp/timeline_$name.txt
line=$(TURBOSPARK_CUDA_TRACE=$raw timeout 300 "$bin" bench --device cuda --json \
    --prompt-len 2048 --gen-len 16 "$@" 2>/dev/null | tail -1)
{
    bench_line "bench, noting the timeline" "$*" "$line"
    python3 .device/timeline.py "$raw" --steps 12 --gap-us "${GAP_US:-50}"
} > "$OUT/timeline_$name.txt" 2>&1
[ "${RAW:-0}" = 1 ] && gzip -c "$raw" > "$OUT/raw_$name.txt.gz"
echo "== $name"
cat "$OUT/timeline_$name.txt"
