# Sourced by the scripts of this folder on the GPU machine (from .device/,
# where bundle.sh copies it): the repository root as the working folder,
# the binaries unpacked, $OUT made (default ./gpu-results) with the GPU's
# name in $OUT/gpu.txt (and, with ONLY_ON, the script stopped on another
# GPU), the cubin cache and the fixtures found, and `bench_line`. Defines
# nothing else.
set -uo pipefail
# Its own path, not $0: sourced from the command line, $0 is `bash`, and
# the scripts then ran one folder too high (it cost two calls once).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
for f in .device/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
# A binary copied without its execute bit fails with nothing on stdout
# (the scripts keep stderr out of their tables): it cost a call once.
chmod +x .device/turbospark* 2>/dev/null
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
# ONLY_ON=H200: a script run where nvidia-smi names another GPU stops here,
# having written the name to $OUT/gpu.txt (a call owed to one GPU kind
# then costs only the machine's start where another kind came).
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt" 2>&1
if [ -n "${ONLY_ON:-}" ] && ! grep -q "$ONLY_ON" "$OUT/gpu.txt"; then
    echo "not on $ONLY_ON ($(head -1 "$OUT/gpu.txt")): nothing run"
    exit 0
fi
export TURBOSPARK_FIXTURES=$PWD/tests/fixtures TURBOSPARK_CACHE=${TURBOSPARK_CACHE:-/tmp/tscache}

# bench_line LABEL PRESET JSON: one line of a `bench --json` run (decode,
# prefill, and the recorded step's census where the build reports it), or
# the start of what came out where it is not JSON.
bench_line() {
    python3 -c 'import json, sys
d = json.loads(sys.argv[3])
g = d.get("decode_graph_nodes")  # builds before deb9c12 lack it
census = " | graph %d kernels, %d of %d edges programmatic" % (
    g["kernels"], g["programmatic_edges"], g["edges"]) if g else ""
print("%s | %s | decode %.1f | prefill %.0f%s" % (
    sys.argv[1], sys.argv[2], d["decode_tok_s"], d["prefill_tok_s"], census))' \
        "$1" "$2" "$3" 2>/dev/null || echo "$1 | $2 | failed: ${3:0:200}"
}
