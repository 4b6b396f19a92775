#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Instructions per site of each phase of an apply program (altbench_alt_N),
# counted by callgrind:
#
#   tools/altbench/callgrind_phases.sh build/tools/altbench/altbench_alt_100000 100000
#   -> N=100000 cold 184.5 nochange 21.7 dryrun 21.7 revert 47.2 warm 47.2
#
# The program, run with "1" (one repetition, on the CPU it starts on), forks
# a child for its cold apply, then applies in the parent: its own first apply, no change, dry run, revert, warm. A dump
# is taken at each entry of altpatch_apply_opts() and only that function (and
# what it calls) is counted, so each dump holds the phase before it: the
# child's one file is the cold apply; the parent's dumps .3, .4 and .5 are the
# no-change, dry-run and revert phases, and its final file the warm apply.
set -eu
if [ $# -ne 2 ]; then
    echo "usage: $0 PROGRAM SITES" >&2
    exit 2
fi
prog=$(readlink -f "$1")
n=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
if ! valgrind --tool=callgrind --dump-before=altpatch_apply_opts \
    --toggle-collect=altpatch_apply_opts "$prog" 1 >run.log 2>&1; then
    echo "$0: $prog failed under valgrind:" >&2
    tail -20 run.log >&2
    exit 1
fi
# the parent's file has dumps .1 to .5 beside it (its own first apply, no
# change, dry run, revert; the warm apply in the file itself), the child's none
parent=
child=
for f in $(ls callgrind.out.* | grep -E 'out\.[0-9]+$'); do
    if [ -e "$f.3" ]; then parent=$f; else child=$f; fi
done
if [ -z "$parent" ] || [ -z "$child" ]; then
    echo "$0: expected the dumps of a parent and of a forked child" >&2
    exit 1
fi
sum() { awk '/^summary/ { print $2 }' "$1"; }
awk -v n="$n" -v a="$(sum "$child")" -v b="$(sum "$parent.3")" -v c="$(sum "$parent.4")" \
    -v d="$(sum "$parent.5")" -v e="$(sum "$parent")" \
    'BEGIN { printf "N=%d cold %.1f nochange %.1f dryrun %.1f revert %.1f warm %.1f\n",
             n, a / n, b / n, c / n, d / n, e / n }'
