#!/usr/bin/env python3
"""Which call sites allocate long-lived small blocks, from a heaptrack recording.

A small block that outlives the short-lived blocks allocated around it keeps their page of the
allocator resident (RELIABILITY.md, "Soak"). This lists, per call site, the small blocks
(at most MAX_SIZE bytes) allocated in a window of the run whose mean lifetime is at least
MIN_LIFE seconds: allocations per minute, mean number alive, and how many more were alive at
the window's end than at its start.

heaptrack's interpreted stream records each allocation and free against its site (size and
stack), not its address, so a block's own lifetime is unknown; a site's mean lifetime is its
mean number alive divided by its allocation rate (Little's law), which is what tells a site
whose blocks live for a cached listing's TTL from one whose blocks die with the request.

    zstdcat /tmp/heap/percolator.zst | docs/profiling/lifetimes.py START_S END_S [MIN_LIFE [MAX_SIZE]]

(RELIABILITY.md, "Soak", and docs/soak-history.md for how the recording is made: the
system-allocator build under heaptrack inside the soak driver.) Reads ~1.5 M lines a second.
"""
import re
import sys
from collections import defaultdict

start_s, end_s = float(sys.argv[1]), float(sys.argv[2])
min_life = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
max_size = int(sys.argv[4]) if len(sys.argv) > 4 else 1024
start_ms, end_ms = start_s * 1000.0, end_s * 1000.0

strings = [""]      # 's': index 0 unused
ips = [[]]          # 'i': per instruction pointer, its function names (inlined frames too)
traces = [(0, 0)]   # 't': (ip, parent trace)
sites = []          # 'a': (size, trace)
live, last_t, area, allocs, live_at_start = [], [], [], [], []
now = 0.0


def advance(i):
    """Adds site i's live count times the time since its last change (within the window)."""
    lo, hi = max(last_t[i], start_ms), min(now, end_ms)
    if hi > lo:
        area[i] += live[i] * (hi - lo)
    last_t[i] = now


for line in sys.stdin:
    tag = line[0]
    if tag == '+' or tag == '-':
        i = int(line[2:], 16)
        advance(i)
        if tag == '+':
            live[i] += 1
            if start_ms <= now <= end_ms:
                allocs[i] += 1
        else:
            live[i] -= 1
    elif tag == 'c':
        t = float(int(line[2:], 16))
        if now < start_ms <= t:
            live_at_start[:] = live
        now = t
        if now > end_ms:
            break
    elif tag == 'a':
        size, trace = line[2:].split()
        sites.append((int(size, 16), int(trace, 16)))
        for column, value in ((live, 0), (last_t, now), (area, 0.0), (allocs, 0), (live_at_start, 0)):
            column.append(value)
    elif tag == 't':
        ip, parent = line[2:].split()
        traces.append((int(ip, 16), int(parent, 16)))
    elif tag == 'i':
        fields = line[2:].split()
        # ip, module, then (function, file, line) per frame, the inlined ones first.
        ips.append([int(fields[k], 16) for k in range(2, len(fields), 3)])
    elif tag == 's':
        parts = line[2:].rstrip('\n').split(' ', 1)
        strings.append(parts[1] if len(parts) > 1 else '')

end = min(now, end_ms)
now = end
for i in range(len(sites)):
    advance(i)
window = (end - start_ms) / 1000.0
if window <= 0:
    sys.exit(f"no sample after {start_s} s")

# The allocator's and the standard library's frames, skipped until the first of the caller's.
PLUMBING = re.compile(r"^(_?<?(alloc|core|std|hashbrown|bytes|serde)(::|\.\.)|__rust|__rdl|malloc|realloc|"
                      r"calloc|heaptrack|posix_memalign|aligned_alloc|_RNv|<&|<T as alloc)")


def caller(trace, depth=4):
    frames = []
    while trace and len(frames) < depth:
        ip, trace = traces[trace]
        for name in reversed(ips[ip] if ip < len(ips) else []):
            text = strings[name] if name < len(strings) else '?'
            if frames or not PLUMBING.match(text):
                frames.append(text[:80])
    return ' <- '.join(frames)


by_caller = defaultdict(lambda: [0, 0.0, 0, set()])
for i, (size, trace) in enumerate(sites):
    if allocs[i] == 0 or size > max_size:
        continue
    mean_live = area[i] / 1000.0 / window
    if mean_live * window / allocs[i] < min_life:
        continue
    row = by_caller[caller(trace)]
    row[0] += allocs[i]
    row[1] += mean_live
    row[2] += live[i] - (live_at_start[i] if i < len(live_at_start) else 0)
    row[3].add(size)

total = sum(row[0] for row in by_caller.values())
print(f"window {start_s:.0f}-{end / 1000:.0f} s; blocks of at most {max_size} B living {min_life:.0f} s or more "
      f"on average: {total / window * 60:.0f} allocated a minute")
print(f"{'per min':>9} {'alive':>7} {'growth':>7}  {'sizes':24}  site")
for site, (n, mean_live, growth, sizes) in sorted(by_caller.items(), key=lambda kv: -kv[1][0])[:40]:
    listed = ','.join(str(s) for s in sorted(sizes))[:24]
    print(f"{n / window * 60:9.0f} {mean_live:7.0f} {growth:7d}  {listed:24}  {site}")
