#!/usr/bin/env python3
"""What each launch of a replayed decode step costs in place, from the
timeline a `TURBOSPARK_CUDA_TRACE=FILE` run writes (src/trace.rs):

    TURBOSPARK_CUDA_TRACE=/tmp/t.txt turbospark bench --device cuda \\
        --synthetic gpt-oss-20b --layers 4 --prompt-len 2048 --gen-len 16
    python3 tools/gpu/timeline.py /tmp/t.txt [--steps 8]

The step's launches are the last graph recording's (`L ... 1` lines); its
replays are found from the end of the timeline, each launch's blocks
grouped by %gridid (a graph node keeps its id in every replay, so each
id's blocks are cut where they lie --gap-us apart) and matched to the
recorded launches by block size and count. A launch's *release* is when its first block's PDL wait returned,
i.e. when the launch before it had finished. Per launch of the step (the
mean over the replays, µs):
- span: its release to the next launch's, the time it holds the step
  (what leaving it out would save, if nothing else moved);
- early: how long before its release its first block was already waiting
  (resident early under programmatic dependent launch; 0 if none was);
- lag: its release to its last block's wait returning (blocks that only
  became resident after the release);
- ready: the share of its blocks already waiting at its release (the
  others reached the wait later: their work before it, copies issued
  early for one, was not hidden).
Then the spans summed by kernel name over a step, and for the launches
whose kernels mark phases (`TS_PHASE(k)` in kernels/common.cuh: a block's
first thread passing a point inside the kernel), when their blocks got
there: per phase, in µs after each block's own wait returned (less what
the block's earlier notes took: phases_of), the median over blocks of
its first and its last pass (a phase inside a loop is passed once a
turn), the latest last pass and what its note took, means over the
replays.
The %globaltimer tick
is printed with the table (32 ns on the H200): where it is coarser than a
span, only the means over many replays mean anything.
"""
import argparse
import bisect
import collections
import math
import statistics
import sys


def load(path, gap_ns):
    """The launches noted, and the launches' block groups in time order:
    [blocks, first reached, first returned, last returned, threads, blocks
    waiting at the first return, phases]. A graph's kernel node keeps its
    %gridid in every replay, so one id's entries are cut into launches
    where their returns are `gap_ns` apart. `phases` maps a phase number to
    its passes, (block, ns after that block's wait returned), in time
    order."""
    launches, by_grid = [], collections.defaultdict(list)
    marks = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            p = line.split()
            if not p or p[0] == "#":
                continue
            if p[0] == "L":
                name, gx, gy, gz, block, _shared, rec = p[1:8]
                launches.append((name, int(gx) * int(gy) * int(gz), int(block), rec == "1"))
            elif p[0] == "E":
                grid, reached, returned, _sm, threads, b = map(int, p[1:7])
                by_grid[grid].append((returned, reached, threads, b))
            elif p[0] == "P":
                grid, at, phase, _sm, _threads, b = map(int, p[1:7])
                held = int(p[7]) if len(p) > 7 else 0  # builds before 2026-12-03 lack it
                marks[grid].append((at, phase, b, held))
    groups = []
    for grid, entries in by_grid.items():
        entries.sort()
        run = [entries[0]]
        for e in entries[1:]:
            if e[0] - run[-1][0] > gap_ns:
                groups.append((grid, run))
                run = []
            run.append(e)
        groups.append((grid, run))
    for m in marks.values():
        m.sort()
    # The blocks already waiting when the launch was released.
    ready = lambda r: sum(1 for e in r if e[1] <= r[0][0])
    groups = [[len(r), min(e[1] for e in r), r[0][0], r[-1][0], r[0][2], ready(r),
               phases_of(r, marks.get(grid, []), gap_ns)] for grid, r in groups]
    return launches, sorted(groups, key=lambda g: g[2])


def phases_of(run, marks, gap_ns):
    """The phase passes of one launch's blocks (`run`: its wait entries):
    its node's marks from its first block's arrival to `gap_ns` after its
    last block's return, each timed from its own block's return less the
    time the block's earlier notes held its first thread (each note's
    slot is an atomic's round trip: ~0.7 µs under load). The wait's own
    note does not say how long it took: the median of the launch's phase
    notes stands in for it. Each pass: (block, ns, ns the note took)."""
    returned = {e[3]: e[0] for e in run}
    lo, hi = min(e[1] for e in run), run[-1][0] + gap_ns
    mine = [m for m in marks[bisect.bisect_left(marks, (lo,)):bisect.bisect_right(marks, (hi,))]
            if m[2] in returned]
    out = collections.defaultdict(list)
    if not mine:
        return out
    held = collections.defaultdict(lambda: statistics.median(m[3] for m in mine))
    for at, phase, b, took in mine:
        out[phase].append((b, at - returned[b] - held[b], took))
        held[b] += took
    return out


def phase_row(phases):
    """Per phase: (passes a block, median first pass, median last pass,
    latest last pass, median time its note took), ns after each block's
    wait returned."""
    row = {}
    for k, passes in phases.items():
        first, last, count = {}, {}, collections.Counter()
        for b, t, _ in passes:
            first.setdefault(b, t)
            last[b] = t
            count[b] += 1
        row[k] = (statistics.median(count.values()), statistics.median(first.values()),
                  statistics.median(last.values()), max(last.values()),
                  statistics.median(p[2] for p in passes))
    return row


def step_launches(launches):
    """The last run of launches issued while recording."""
    end = max((i for i, l in enumerate(launches) if l[3]), default=None)
    if end is None:
        sys.exit("no recorded launch in the timeline (was a decode step recorded?)")
    start = end
    while start > 0 and launches[start - 1][3]:
        start -= 1
    return launches[start:end + 1]


def replays(step, groups, want):
    """The last `want` whole replays: lists of groups, one a launch."""
    k = len(step)
    fits = lambda g, l: g[4] == l[2] and g[0] <= l[1]
    i = len(groups) - 1
    # Launches after the last replay (outside the graph) do not fit its end.
    while i >= 0 and not fits(groups[i], step[-1]):
        i -= 1
    out = []
    while len(out) < want and i + 1 >= k:
        chunk = groups[i - k + 1:i + 1]
        if not all(fits(g, l) for g, l in zip(chunk, step)):
            break
        out.append(chunk)
        i -= k
    return out[::-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--steps", type=int, default=8, help="replays to average (the last ones)")
    ap.add_argument("--gap-us", type=float, default=50.0,
                    help="a node's blocks this far apart belong to different replays")
    a = ap.parse_args()
    launches, groups = load(a.file, a.gap_us * 1000)
    step = step_launches(launches)
    reps = replays(step, groups, a.steps)
    if len(reps) < 2:
        sys.exit(f"found {len(reps)} whole replays of the {len(step)}-launch step; need 2")
    stamps = sorted({g[2] for r in reps for g in r})
    tick = 0
    for a, b in zip(stamps, stamps[1:]):
        tick = math.gcd(tick, b - a)
    print(f"{len(step)} launches a step, {len(reps)} replays; %globaltimer ticks {tick} ns")
    steps = [reps[i + 1][0][2] - reps[i][0][2] for i in range(len(reps) - 1)]
    print(f"step: {statistics.mean(steps) / 1000:.1f} µs (release to release of its first launch)")
    rows = []
    by_name = collections.defaultdict(float)
    for j, (name, blocks, threads, _) in enumerate(step):
        span, early, lag, seen, ready = [], [], [], [], []
        for r, rep in enumerate(reps[:-1]):
            g = rep[j]
            nxt = rep[j + 1] if j + 1 < len(step) else reps[r + 1][0]
            span.append(nxt[2] - g[2])
            early.append(max(0, g[2] - g[1]))
            lag.append(g[3] - g[2])
            seen.append(g[0])
            ready.append(100 * g[5] / g[0])
        m = statistics.mean(span) / 1000
        by_name[name] += m
        rows.append((j, name, f"{blocks}x{threads}", statistics.median(seen), m,
                     statistics.mean(early) / 1000, statistics.mean(lag) / 1000,
                     statistics.mean(ready)))
    print(f"{'#':>3} {'kernel':34} {'grid':>10} {'blocks':>6} {'span':>7} {'early':>7} "
          f"{'lag':>6} {'ready':>6}")
    for j, name, grid, seen, m, e, l, rd in rows:
        print(f"{j:3d} {name:34} {grid:>10} {seen:6.0f} {m:7.2f} {e:7.2f} {l:6.2f} {rd:5.0f}%")
    print("\nspans by kernel, µs a step:")
    total = sum(by_name.values())
    for name, t in sorted(by_name.items(), key=lambda x: -x[1]):
        print(f"  {name:34} {t:9.1f}  {100 * t / total:5.1f}%")
    print_phases(step, reps)


def print_phases(step, reps):
    """The phase table of the launches that mark phases."""
    lines = []
    for j, (name, _blocks, _threads, _) in enumerate(step):
        rows = [phase_row(rep[j][6]) for rep in reps if rep[j][6]]
        if not rows:
            continue
        for k in sorted({k for r in rows for k in r}):
            got = [r[k] for r in rows if k in r]
            n, first, last, latest, note = (statistics.mean(v[i] for v in got)
                                            for i in range(5))
            lines.append(f"{j:3d} {name:34} {k:5d} {n:6.1f} {first / 1000:7.2f} "
                         f"{last / 1000:7.2f} {latest / 1000:7.2f} {note / 1000:6.2f}")
    if lines:
        print("\nphases, µs after each block's wait returned, less what the block's earlier "
              "notes took (median over blocks; latest: the largest last pass; note: the "
              "median time this phase's note took):")
        print(f"{'#':>3} {'kernel':34} {'phase':>5} {'passes':>6} {'first':>7} {'last':>7} "
              f"{'latest':>7} {'note':>6}")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
