#!/usr/bin/env bash
# The spread over several bench-report runs (target/bench-report.json
# files, one a run): for each of our ratios to a peer, the per-run-ratio
# median of each file and their min-max; for each row, the median ns of
# each file and their (max - min) / median.
#
#   bench/spread.sh bench/baseline/bench-report-cc5cc97*.json
set -euo pipefail
command -v jq >/dev/null || { echo "$0: needs jq" >&2; exit 2; }
if [[ $# -lt 2 ]]; then
  echo "usage: $0 A.json B.json [...]" >&2
  exit 2
fi
echo "ours / peer, median of the per-run ratios in each of $# files (min-max over the files):"
jq -rs '[.[] | (.ratios // [])[]] | group_by([.shape, .peer, .path])[]
  | [.[0].shape, ("ours/" + .[0].peer + ": " + .[0].path), (map(.per_run_median) | map(tostring) | join(" "))] | @tsv' "$@" |
  awk -F'\t' '{ n = split($3, v, " "); lo = v[1]; hi = v[1]; s = "";
    for (i = 1; i <= n; i++) { if (v[i] < lo) lo = v[i]; if (v[i] > hi) hi = v[i]; s = s sprintf(" %.2f", v[i]) }
    printf "  %-8s %-66s%s   (%.2f-%.2f)\n", $1, $2, s, lo, hi }'
echo
echo "ns per call, the median of each file, lowest first ((max - min) / median of the medians):"
jq -rs '[.[] | .rows[]] | group_by([.shape, .name])[]
  | [.[0].shape, .[0].name, (map(.ns_per_call) | map(tostring) | join(" "))] | @tsv' "$@" |
  awk -F'\t' '{ n = split($3, v, " "); asort(v); med = (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2); s = "";
    for (i = 1; i <= n; i++) s = s sprintf(" %8.1f", v[i])
    printf "  %-8s %-66s%s   (%3.0f%%)\n", $1, $2, s, (v[n] - v[1]) / med * 100 }'
