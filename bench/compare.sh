#!/usr/bin/env bash
# Compares two benchmark outputs row by row and prints new / old.
#
#   bench/compare.sh OLD.json NEW.json   # bench-report outputs (target/bench-report.json):
#                                        # ns per call (median), allocations per call,
#                                        # and each ours/peer ratio
#   bench/compare.sh OLD.tsv NEW.tsv     # callgrind.sh outputs (target/callgrind/summary.tsv):
#                                        # Ir per call and Ir added over the floor
#
# Rows present in only one file are listed as such. Needs jq for the JSON
# form.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 OLD NEW   (two bench-report .json or two callgrind summary .tsv files)" >&2
  exit 2
fi
old=$1 new=$2

case $old in
*.json)
  command -v jq >/dev/null || { echo "$0: needs jq" >&2; exit 2; }
  rows() { jq -r '.rows[] | [.shape, .name, .ns_per_call, .allocs_per_call] | @tsv' "$1"; }
  ratios() {
    jq -r '(.ratios // [])[] | [.shape, ("ours/" + .peer + ": " + .path), .per_run_median, .per_run_min, .per_run_max] | @tsv' "$1"
  }
  echo "ns per call (median of the runs) and allocations per call, new / old:"
  printf '  %-8s %-66s %9s %9s %6s %7s %7s\n' shape row "old ns" "new ns" new/old "old al" "new al"
  join -t $'\t' -a 1 -a 2 -e '' -o 0,1.2,1.3,2.2,2.3 \
    <(rows "$old" | awk -F'\t' '{ print $1 " | " $2 "\t" $3 "\t" $4 }' | sort -t $'\t' -k1,1) \
    <(rows "$new" | awk -F'\t' '{ print $1 " | " $2 "\t" $3 "\t" $4 }' | sort -t $'\t' -k1,1) |
    awk -F'\t' '{
      split($1, k, " \\| ");
      if ($2 == "") { printf "  %-8s %-66s %9s %9.1f %6s %7s %7.2f  (new row)\n", k[1], k[2], "-", $4, "-", "-", $5; next }
      if ($4 == "") { printf "  %-8s %-66s %9.1f %9s %6s %7.2f %7s  (gone)\n", k[1], k[2], $2, "-", "-", $3, "-"; next }
      printf "  %-8s %-66s %9.1f %9.1f %6.3f %7.2f %7.2f\n", k[1], k[2], $2, $4, $4 / $2, $3, $5
    }'
  echo
  echo "ours / peer (median of the per-run ratios, min-max), old -> new:"
  join -t $'\t' -o 0,1.2,1.3,1.4,2.2,2.3,2.4 \
    <(ratios "$old" | awk -F'\t' '{ print $1 " | " $2 "\t" $3 "\t" $4 "\t" $5 }' | sort -t $'\t' -k1,1) \
    <(ratios "$new" | awk -F'\t' '{ print $1 " | " $2 "\t" $3 "\t" $4 "\t" $5 }' | sort -t $'\t' -k1,1) |
    awk -F'\t' '{
      split($1, k, " \\| ");
      printf "  %-8s %-66s %.2f (%.2f-%.2f) -> %.2f (%.2f-%.2f)\n", k[1], k[2], $2, $3, $4, $5, $6, $7
    }'
  ;;
*.tsv)
  echo "Ir per call and Ir added over the floor, new / old:"
  printf '  %-28s %9s %9s %7s   %-24s %9s %9s\n' mode "old Ir" "new Ir" new/old floor "old add" "new add"
  join -t $'\t' -a 1 -a 2 -e '' -o 0,1.2,1.3,1.4,2.2,2.3,2.4 \
    <(sort -t $'\t' -k1,1 "$old") <(sort -t $'\t' -k1,1 "$new") |
    awk -F'\t' '{
      if ($2 == "") { printf "  %-28s %9s %9.1f %7s   (new mode)\n", $1, "-", $5, "-"; next }
      if ($5 == "") { printf "  %-28s %9.1f %9s %7s   (gone)\n", $1, $2, "-", "-"; next }
      floor = ($6 == "" ? $3 : $6)
      printf "  %-28s %9.1f %9.1f %7.3f   %-24s %9s %9s\n", $1, $2, $5, $5 / $2, floor, $4, $7
    }'
  ;;
*)
  echo "$0: expected .json (bench-report) or .tsv (callgrind.sh) files" >&2
  exit 2
  ;;
esac
