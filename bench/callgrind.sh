#!/usr/bin/env bash
# Instructions per call under callgrind, one path per binary (src/callgrind.rs
# says why), each polled directly with no executor: the bare floors, the paths
# of tower-circuit-breaker users run, and the peers' paths where they have
# them. Each runs at two call counts; the difference divided by the
# difference in calls is the per-call figure, free of start-up costs. Only
# the call loop (`measure::poll_calls`) is counted: the set-up and tear-down
# around it do the same work at both counts, but not always the same
# allocator housekeeping (glibc consolidating its free lists in one process
# and not the other moved the keyed rows, which build and drop 10,000
# breakers, by tens of instructions a call). Every
# binary checks that each call ended as its path says (admitted, failed one
# call in 50, or rejected) and the script stops if one did not.
#
#   bench/callgrind.sh                         # every mode, N1=100000 N2=200000
#   MODES="closed open" bench/callgrind.sh     # a subset (their floors come along)
#   N1=50000 N2=100000 bench/callgrind.sh
#   FEATURES="tower-circuit-breaker/metrics tower-circuit-breaker/status" bench/callgrind.sh
#                                              # the crate built with features on
#
# Prints the table and writes it to target/callgrind/summary.txt, and the
# figures one mode a line (mode, Ir per call, floor, added) to
# target/callgrind/summary.tsv, which bench/compare.sh reads.
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

# mode | floor it is measured over ("-": a floor) | label
table='
bare                         -               bare service_fn, answering at once
failing                      -               bare service_fn, failing at once
bare-5xx                     -               bare service_fn, every 50th a 503
bare-json                    -               bare service_fn, a JSON 200
passthrough                  bare            tower MapResponse doing nothing (reference)
passthrough-wrapped          bare            MapResponse, body rebuilt in a 64-byte wrapper (reference)
closed                       bare            closed
closed-shared                closed          closed, shared through a live Redis backend
closed-5xx                   bare-5xx        closed, 2 % failing
http-json                    bare-json       closed, HttpClassifier, JSON 200
llm-json                     http-json       closed, LlmClassifier, JSON 200
slow                         closed          closed, slow-call rule on
window                       bare            closed, time window 30 s / 20 buckets
classic                      bare            closed, classical: opens outright, no in-flight limit, no ramp
spend                        closed          closed, a spend guard on (never reached), 20 cents a call
stack-closed                 closed          closed, through stack::Stack (retry, breaker, attempt timeout)
failover                     closed          failover of two closed breakers, the primary answering
failover-selection           failover        failover of two, peak-EWMA selection
failover-hedge               failover        failover of two, hedging after 60 s (none sent)
closed-rotating              bare            closed, unkeyed, behind the keyed rotation (reference)
keyed-hot                    closed          closed, keyed, one hot key of 10,000
keyed-rotating               closed          closed, keyed, rotating over 10,000 keys
open                         failing         open, rejecting
open-named                   failing         open, named breaker
stack-open                   failing         open, through stack::Stack
keyed-open                   failing         open, keyed, one open key of 10,000
recloser-closed              bare            recloser 1.4, closed
recloser-5xx                 bare-5xx        recloser 1.4, closed, 2 % failing
recloser-open                failing         recloser 1.4, open
failsafe-closed              bare            failsafe 1.3, closed (a time window)
failsafe-5xx                 bare-5xx        failsafe 1.3, closed, 2 % failing
failsafe-open                failing         failsafe 1.3, open
tower-resilience-closed      bare            tower-resilience 0.14, closed
tower-resilience-5xx         bare-5xx        tower-resilience 0.14, closed, 2 % failing
tower-resilience-slow        tower-resilience-closed tower-resilience 0.14, slow-call rule on
tower-resilience-open        failing         tower-resilience 0.14, open
tower-resilience-open-named  failing         tower-resilience 0.14, open, named
seatbelt-closed              bare            seatbelt 0.11, closed (a time window)
seatbelt-5xx                 bare-5xx        seatbelt 0.11, closed, 2 % failing
seatbelt-open                failing         seatbelt 0.11, open (named, as every seatbelt breaker)
'
# tower-resilience's time window has no line: it keeps every call of the
# last 30 s and scans them on every call, so its cost per call grows with
# the calls made (bench-report has its row, at the calls of one run).
# A second figure for some of ours: what the path adds over another of ours.
also='
closed passthrough-wrapped
closed-shared bare
closed-5xx closed
window closed
classic closed
open-named open
keyed-open open
keyed-rotating closed-rotating
stack-open open
'
# DESIGN.md's targets: mode, over, at most this many Ir added, or (a mode
# name) no more than that mode adds over its own floor in the same run.
targets='
closed          bare        recloser-closed
closed-5xx      bare-5xx    recloser-5xx
open            failing     230
slow            closed      200
keyed-rotating  closed      150
llm-json        http-json   50
'

floor_of() { awk -v m="$1" 'NF && $1 == m { print $2 }' <<<"$table"; }
label_of() { awk -v m="$1" 'NF && $1 == m { $1 = ""; $2 = ""; sub(/^ +/, ""); print }' <<<"$table"; }
known=$(awk 'NF { print $1 }' <<<"$table")

# The modes asked for, then their floors (and their floors' floors), in
# table order. The shared row needs Redis (REDIS_URL, by default
# 127.0.0.1:6379): without one answering it is left out of the default set.
default=$known
if [[ -z ${MODES:-} && -z ${REDIS_URL:-} ]] && ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
  echo "no Redis on 127.0.0.1:6379: leaving out closed-shared" >&2
  default=$(grep -vx closed-shared <<<"$known")
fi
want=" $(echo ${MODES:-$default}) "
for m in $want; do
  grep -qx -- "$m" <<<"$known" || { echo "unknown mode: $m (known: $(echo $known))" >&2; exit 2; }
done
for _ in 1 2 3; do
  for m in $want; do
    f=$(floor_of "$m")
    if [[ $f != - && $want != *" $f "* ]]; then want="$want$f "; fi
  done
done
modes=$(for m in $known; do if [[ $want == *" $m "* ]]; then echo "$m"; fi; done)

local_modes=$(grep -vx closed-shared <<<"$modes" || true)
cargo build --quiet --release -p tower-circuit-breaker-bench ${FEATURES:+--features "$FEATURES"} \
  $(printf -- '--bin cg-%s ' $local_modes)
# Built on its own, so the redis feature reaches no other row's binary.
if grep -qx closed-shared <<<"$modes"; then
  cargo build --quiet --release -p tower-circuit-breaker-bench --features "redis ${FEATURES:-}" \
    --bin cg-closed-shared
fi

ir() { # mode calls -> total Ir
  if ! valgrind --tool=callgrind --toggle-collect='*measure::poll_calls*' \
    --callgrind-out-file="$out/$1.$2.out" \
    "$target/release/cg-$1" "$2" >"$out/$1.$2.log" 2>&1; then
    echo "cg-$1 $2 failed:" >&2
    grep -v '^==' "$out/$1.$2.log" >&2 || true
    exit 1
  fi
  awk '/^(summary|totals):/ { print $2; exit }' "$out/$1.$2.out"
}

declare -A irs
for m in $modes; do
  a=$(ir "$m" "$n1")
  b=$(ir "$m" "$n2")
  irs[$m]=$(awk -v a="$a" -v b="$b" -v n1="$n1" -v n2="$n2" 'BEGIN { printf "%.1f", (b - a) / (n2 - n1) }')
done
minus() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a - b }'; }

{
  echo "instructions per call (Ir), $n1 vs $n2 calls; added = over the floor named"
  printf '  %-58s %8s  %s\n' "path" "Ir/call" "added"
  : >"$out/summary.tsv.new"
  for m in $modes; do
    f=$(floor_of "$m")
    if [[ $f == - ]]; then
      printf '  %-58s %8s  %s\n' "$(label_of "$m")" "${irs[$m]}" "(floor)"
      printf '%s\t%s\t-\t-\n' "$m" "${irs[$m]}" >>"$out/summary.tsv.new"
    else
      d=$(minus "${irs[$m]}" "${irs[$f]}")
      extra=""
      o=$(awk -v m="$m" 'NF && $1 == m { print $2 }' <<<"$also")
      if [[ -n $o && -n ${irs[$o]:-} ]]; then
        extra="; over $o: $(minus "${irs[$m]}" "${irs[$o]}")"
      fi
      printf '  %-58s %8s  %s\n' "$(label_of "$m")" "${irs[$m]}" "$d over $f$extra"
      printf '%s\t%s\t%s\t%s\n' "$m" "${irs[$m]}" "$f" "$d" >>"$out/summary.tsv.new"
    fi
  done
  shown=
  while read -r m over limit; do
    [[ -n $m && -n ${irs[$m]:-} && -n ${irs[$over]:-} ]] || continue
    what=$limit
    if [[ ! $limit =~ ^[0-9.]+$ ]]; then
      # A peer's row: what it adds over its own floor.
      lf=$(floor_of "$limit")
      [[ -n ${irs[$limit]:-} && -n ${irs[$lf]:-} ]] || continue
      what="$limit's $(minus "${irs[$limit]}" "${irs[$lf]}")"
      limit=$(minus "${irs[$limit]}" "${irs[$lf]}")
    fi
    if [[ -z $shown ]]; then echo; echo "targets (DESIGN.md), Ir added:"; shown=1; fi
    d=$(minus "${irs[$m]}" "${irs[$over]}")
    v=$(awk -v d="$d" -v l="$limit" 'BEGIN { print (d <= l ? "met" : "MISSED") }')
    printf '  %-40s %8s over %-10s (at most %s: %s)\n' "$(label_of "$m")" "$d" "$over" "$what" "$v"
  done <<<"$targets"
  if [[ -n ${irs[closed]:-} ]]; then
    echo
    echo "closed path, Ir per call by function ($n2 calls; $out/closed.$n2.out):"
    callgrind_annotate --show-percs=no "$out/closed.$n2.out" 2>/dev/null |
      awk -v n="$n2" '/file:function/ { on = 1; next }
        on && NF == 0 && shown { exit }
        on && $1 ~ /^[0-9][0-9,]*$/ { v = $1; gsub(",", "", v); $1 = ""; sub(/^ +/, "");
          sub(/ \[.*\]$/, ""); printf "  %7.1f  %s\n", v / n, $0; shown = 1 }' | head -25
  fi
} | tee "$out/summary.txt"
mv "$out/summary.tsv.new" "$out/summary.tsv"
