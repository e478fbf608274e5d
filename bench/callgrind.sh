#!/usr/bin/env bash
# Instructions per call under callgrind: the bare service (answering, and
# failing), the closed, open (rejecting) and keyed paths of
# tower-circuit-breaker, and recloser's closed and open paths, each in its
# own binary (src/callgrind.rs says why) and polled directly with no
# executor. Each runs at two call counts; the difference divided by the
# difference in calls is the per-call figure, free of start-up costs.
#
#   bench/callgrind.sh            # N1=100000 N2=200000
#   N1=50000 N2=100000 bench/callgrind.sh
#
# Needs valgrind (`apt-get install valgrind`). Callgrind counts instructions,
# not time: a clock read goes through the vDSO, which it does not follow, and
# an atomic read-modify-write counts as one instruction however long it
# stalls, so read these next to the timed report, not instead of it.
set -euo pipefail
cd "$(dirname "$0")/.."

n1=${N1:-100000}
n2=${N2:-200000}
target=${CARGO_TARGET_DIR:-target}
out="$target/callgrind"
mkdir -p "$out"

modes="bare failing closed open keyed recloser-closed recloser-open"
cargo build --quiet --release -p tower-circuit-breaker-bench $(printf -- '--bin cg-%s ' $modes)

ir() { # mode calls -> total Ir
  valgrind --tool=callgrind --callgrind-out-file="$out/$1.$2.out" \
    "$target/release/cg-$1" "$2" >/dev/null 2>&1
  awk '/^(summary|totals):/ { print $2; exit }' "$out/$1.$2.out"
}

per_call() { # mode -> Ir per call
  local a b
  a=$(ir "$1" "$n1")
  b=$(ir "$1" "$n2")
  awk -v a="$a" -v b="$b" -v n1="$n1" -v n2="$n2" 'BEGIN { printf "%.1f", (b - a) / (n2 - n1) }'
}

for m in $modes; do
  declare "ir_${m//-/_}=$(per_call "$m")"
done
minus() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a - b }'; }
echo "instructions per call (Ir), $n1 vs $n2 calls:"
echo "  bare service_fn, ready at once    $ir_bare"
echo "  bare service_fn, failing at once  $ir_failing"
echo "  closed                            $ir_closed  (added over bare: $(minus "$ir_closed" "$ir_bare"))"
echo "  open, rejecting                   $ir_open  (added over failing: $(minus "$ir_open" "$ir_failing"))"
echo "  closed, keyed (10,000 keys)       $ir_keyed  (added over closed: $(minus "$ir_keyed" "$ir_closed"))"
echo "  recloser 1.4, closed              $ir_recloser_closed  (added over bare: $(minus "$ir_recloser_closed" "$ir_bare"))"
echo "  recloser 1.4, open, rejecting     $ir_recloser_open  (added over failing: $(minus "$ir_recloser_open" "$ir_failing"))"
echo
echo "closed path, Ir per call by function ($n2 calls; $out/closed.$n2.out):"
callgrind_annotate --show-percs=no "$out/closed.$n2.out" 2>/dev/null |
  awk -v n="$n2" '/file:function/ { on = 1; next }
    on && NF == 0 && shown { exit }
    on && $1 ~ /^[0-9][0-9,]*$/ { v = $1; gsub(",", "", v); $1 = ""; sub(/^ +/, "");
      sub(/ \[.*\]$/, ""); printf "  %7.1f  %s\n", v / n, $0; shown = 1 }' | head -25
