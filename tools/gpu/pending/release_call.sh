#!/usr/bin/env bash
# Prepared in the thirty-seventh session for one device call (~6 minutes):
# where each kernel lets its dependents launch (`pdl_enter`'s
# release_first), a kernel file at a time, per format. On main the
# combine releases first for int4 only (BENCHMARKS.md, thirty-seventh
# session: int4 +2.1%, bf16 -4.5% with it). Here:
#   git apply tools/gpu/pending/release_knobs.patch
#   TESTS=parity_kv tools/gpu/bundle.sh
#   git apply -R tools/gpu/pending/release_knobs.patch
#   cp tools/gpu/pending/release_call.sh .device/
# There (carry [".device"]): .device/release_call.sh
. "$(dirname "$0")/common.sh"
every=TS_EARLY_QXD,TS_EARLY_ATT,TS_EARLY_DENSE,TS_EARLY_STREAM,TS_EARLY_COMB
echo "parity_kv, every knob on: $(TS_DEFINES=$every .device/parity_kv 2>&1 | grep -E 'test result|panicked' | head -2)" > "$OUT/tests.txt"
# int4: the non-expert integer GEMVs and the attention step too.
.device/knobs.sh 2 "TS_DEFINES= TS_DEFINES=TS_EARLY_QXD,TS_EARLY_ATT" "llama-3.1-8b --quant int4 --layers 16"
# bf16: which kernel's early release helps or hurts.
.device/knobs.sh 1 "TS_DEFINES= TS_DEFINES=TS_EARLY_DENSE TS_DEFINES=TS_EARLY_STREAM TS_DEFINES=TS_EARLY_ATT TS_DEFINES=TS_EARLY_COMB" "llama-3.1-8b --layers 16"
# gpt-oss-20b: its dense (bf16) GEMVs.
.device/knobs.sh 2 "TS_DEFINES= TS_DEFINES=TS_EARLY_DENSE" gpt-oss-20b
# Why bf16 loses with the combine's release: its launches in place.
TS_DEFINES=TS_EARLY_COMB .device/timeline.sh bf16_comb --synthetic llama-3.1-8b --layers 8 >/dev/null
.device/timeline.sh bf16 --synthetic llama-3.1-8b --layers 8 >/dev/null
