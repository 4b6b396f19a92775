#!/usr/bin/env bash
# Fails when a dynamic relocation of ELF file $1 lands in the record table
# (altinstr_table, or altinstructions for format 1), altinstr_replacement or .note.altpatch: the tables must need none (their
# offsets are self-relative), in PIE executables and shared objects alike.
set -euo pipefail
f=$1
names=() lo=() hi=()
while read -r name addr size; do
    names+=("$name")
    lo+=($((16#$addr)))
    hi+=($((16#$addr + 16#$size)))
done < <(readelf -SW "$f" | sed -E 's/^ *\[ *[0-9]+\] *//' |
         awk '$1 == "altinstr_table" || $1 == "altinstructions" || $1 == "altinstr_replacement" || $1 == ".note.altpatch" { print $1, $3, $5 }')
[ "${#names[@]}" -eq 3 ] || { echo "$f: expected the 3 altpatch sections, got: ${names[*]:-none}" >&2; exit 1; }
nrel=0 bad=0
while read -r off rest; do
    nrel=$((nrel + 1))
    o=$((16#$off))
    for i in 0 1 2; do
        if [ "$o" -ge "${lo[$i]}" ] && [ "$o" -lt "${hi[$i]}" ]; then
            echo "$f: dynamic relocation in ${names[$i]}: $off $rest" >&2
            bad=1
        fi
    done
done < <(readelf -rW "$f" | grep -E '^[0-9a-f]+ ')
[ "$nrel" -gt 0 ] || { echo "$f: no dynamic relocation at all: is it really PIE / shared?" >&2; exit 1; }
[ "$bad" -eq 0 ] || exit 1
echo "$f: $nrel dynamic relocations, none in the altpatch sections"
