#!/usr/bin/env bash
# Prepared in the thirty-seventh session for one device call (~8 minutes):
# int8's gate/up starts with half its blocks resident, each waiting for
# the o block on its SM to leave, since their rings (~140 KB and ~200 KB)
# do not fit together (BENCHMARKS.md, thirty-seventh session, item 5).
# int8_coresident.patch caps the two rings' stages (TS_QX_CAPS=O,GU: 2
# stages of o's 35 KB and 4 of gate/up's make ~75 + ~145 KB, which fit
# beside each other) and can ask for the largest shared-memory carveout
# on the streamed GEMVs, the attention step and the combine
# (TS_CARVEOUT=max; the driver otherwise picks a carveout per kernel,
# which may leave an SM configured too small for the next kernel's block).
# Here:
#   git apply tools/gpu/pending/int8_coresident.patch
#   TESTS=parity_linear tools/gpu/bundle.sh
#   git apply -R tools/gpu/pending/int8_coresident.patch
#   cp tools/gpu/pending/int8_coresident_call.sh .device/
# There (carry [".device"]): .device/int8_coresident_call.sh
. "$(dirname "$0")/common.sh"
L="llama-3.1-8b --quant int8 --layers 16"
echo "parity_linear, caps 2,4: $(TS_QX_CAPS=2,4 .device/parity_linear 2>&1 | grep -E 'test result|panicked' | head -2)" > "$OUT/tests.txt"
.device/knobs.sh 2 "TS_QX_CAPS= TS_QX_CAPS=2,4 TS_QX_CAPS=3,4 TS_CARVEOUT=max" "$L"
TS_CARVEOUT=max .device/knobs.sh 2 "TS_QX_CAPS= TS_QX_CAPS=2,4" "$L"
# int4 and gpt-oss-20b: the carveout alone (int4's attention step is 20%
# resident at its release beside q/k/v's blocks).
.device/knobs.sh 2 "TS_CARVEOUT= TS_CARVEOUT=max" "llama-3.1-8b --quant int4 --layers 16" gpt-oss-20b
TS_QX_CAPS=2,4 GAP_US=95 .device/timeline.sh int8_caps24 --synthetic llama-3.1-8b --quant int8 --layers 8 >/dev/null
TS_CARVEOUT=max TS_QX_CAPS=2,4 GAP_US=95 .device/timeline.sh int8_caps24_max --synthetic llama-3.1-8b --quant int8 --layers 8 >/dev/null
