#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Distinct 4 KiB pages of a program's own code that its first
# altpatch_apply() executes, counted by callgrind, then those of every
# object it executes (the program, the C library, the loader, Zydis):
#
#   tools/altbench/code_pages.sh ./startup_8_pp
#   -> pages=13 instructions=16452
#      objects: startup_8_pp=13 libc.so.6=7 ld-linux-x86-64.so.2=8 ...
#
# A fresh process maps each page of code on its first use; on some
# hypervisors each costs microseconds beyond the fault the guest counts
# (docs/benchmarks.md, part 3b). The program's pre-patched copy must be made
# under valgrind (its CPUID is its own): valgrind -q altprepatch --cpu=host.
set -eu
if [ $# -ne 1 ]; then
    echo "usage: $0 PROGRAM" >&2
    exit 2
fi
prog=$(readlink -f "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
if ! valgrind --tool=callgrind --dump-instr=yes --compress-pos=no --compress-strings=no \
    --toggle-collect=altpatch_apply "$prog" >run.log 2>&1; then
    echo "$0: $prog failed under valgrind:" >&2
    tail -20 run.log >&2
    exit 1
fi
# cost lines are "0xADDR LINE COST" (absolute positions); the page is the
# address without its last three hex digits; ob= names the object of the
# lines that follow
# (the second line: every object's pages, the program's among them)
awk -v prog="$prog" '
    /^ob=/ { ob = substr($0, 4) }
    /^calls=/ { call = 1; next }
    /^0x/ {
        if (call) { call = 0; next }        # the callee inclusive cost line
        n += $3
        p = substr($1, 1, length($1) - 3)
        if (ob == prog) pages[p] = 1
        if (!((ob, p) in any)) { any[ob, p] = 1; per[ob]++ }
    }
    END {
        c = 0; for (p in pages) c++; printf "pages=%d instructions=%d\n", c, n
        line = "objects:"
        for (o in per) { b = o; sub(/.*\//, "", b); line = line " " b "=" per[o] }
        print line
    }
' callgrind.out.*
