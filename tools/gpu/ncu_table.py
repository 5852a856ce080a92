"""The last N kernels of an `ncu --csv --metrics ...` run, one line each.

Reads ncu's CSV (one row per kernel and metric) from stdin; prints the
kernel's launch id, name, grid, block and each metric, for the last N
kernels launched (argv[1]). With argv[1] == "sum": one line per kernel name,
its launches and their summed duration (µs), longest first: where a whole
run (a prefill) spends its time.
"""

import csv
import signal
import sys

# Piped into `head`: end quietly when the reader has had enough.
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

rows = list(csv.reader(sys.stdin))
start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
header = rows[start]
col = {name: i for i, name in enumerate(header)}
kernels, order = {}, []
for r in rows[start + 1:]:
    if len(r) < len(header):
        continue
    key = (int(r[col["ID"]]), r[col["Kernel Name"]][:34], r[col["Grid Size"]], r[col["Block Size"]])
    if key not in kernels:
        kernels[key] = {}
        order.append(key)
    metric = r[col["Metric Name"]].split("__")[1]
    kernels[key][metric] = r[col["Metric Value"]].replace(",", "")
if sys.argv[1] == "sum":
    total, count = {}, {}
    for key in order:
        name = key[1]
        total[name] = total.get(name, 0.0) + float(kernels[key].get("time_duration.sum", 0)) / 1e3
        count[name] = count.get(name, 0) + 1
    everything = sum(total.values())
    print(f"all kernels: {everything:.0f} us")
    for name in sorted(total, key=total.get, reverse=True):
        print(f"{total[name]:10.1f} us {100 * total[name] / everything:5.1f}% {count[name]:5d}x {name}")
    sys.exit(0)
for key in order[-int(sys.argv[1]):]:
    print(*key, " ".join(f"{k}={v}" for k, v in kernels[key].items()))
