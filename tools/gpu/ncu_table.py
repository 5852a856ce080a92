"""The last N kernels of an `ncu --csv --metrics ...` run, one line each.

Reads ncu's CSV (one row per kernel and metric) from stdin; prints the
kernel's launch id, name, grid, block and each metric, for the last N
kernels launched (argv[1]).
"""

import csv
import sys

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
for key in order[-int(sys.argv[1]):]:
    print(*key, " ".join(f"{k}={v}" for k, v in kernels[key].items()))
