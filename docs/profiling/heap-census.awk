# Sums the HEAPCENSUS lines of a profiling build (docs/profiling/heap-census.patch) over the
# threads, per 30 s: the heap's pages, the bytes they have touched and the bytes allocated in
# them, in all and for chosen block sizes.
#   grep HEAPCENSUS percolator.log | awk -v sizes=32,48,64,128,192,8192 -f docs/profiling/heap-census.awk
# Prints one line per period: minutes since the first, then committed/used MiB in all and per size.
{
  t = int($2 / 30)
  if (first == "") first = t
  if (!(t in seen)) { seen[t] = 1; order[++n] = t }
  split($6, c, "="); split($7, u, "=")
  committed[t] += c[2] + 0; used[t] += u[2] + 0
  for (i = 9; i <= NF; i++) {
    split($i, f, /[:pK\/]+/)
    bc[t, f[1]] += f[3]; bu[t, f[1]] += f[4]
  }
}
END {
  k = split(sizes, size, ",")
  printf "%6s %13s", "min", "all"
  for (j = 1; j <= k; j++) printf " %11s", size[j] " B"
  printf "\n"
  for (i = 1; i <= n; i++) {
    t = order[i]
    printf "%6.1f %6.1f/%-6.1f", (t - first) / 2, committed[t] / 1024, used[t] / 1024
    for (j = 1; j <= k; j++) printf " %5.1f/%-5.1f", bc[t, size[j]] / 1024, bu[t, size[j]] / 1024
    printf "\n"
  }
}
