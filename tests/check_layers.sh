#!/usr/bin/env bash
# The floors of libaltpatch (docs/architecture.md): a file of altpatch/src
# may use only its own floor and the floors below it.
#
#   check_layers.sh SRC_DIR [OBJ...]    the library (OBJ: objects or directories)
#   check_layers.sh --tools TOOLS_DIR   the tools: public headers only
#
# SRC_DIR mode fails when
#   - a file includes the header of a higher floor (or an internal header
#     this script does not know),
#   - a .c file has no floor in the table below (a new file must be given one),
#   - a file other than insn.c includes Zydis,
#   - with OBJ (the objects of SRC_DIR's .c files, NAME.c.o or NAME.o):
#     an object calls or reads a hidden ap_* or public altpatch_* name that an
#     object of a higher floor defines (the include rule alone cannot see a
#     call through a declaration of one's own).
# --tools fails when a file under TOOLS_DIR includes an internal header of
# the library (or anything under altpatch/src).
set -euo pipefail

declare -A floor_of=(
    [util.h]=0 [pure.h]=1 [plan.h]=2 [host.h]=3 [apply.h]=4
    [util.c]=0 [mem.c]=0 [reason.c]=0 [primitives.c]=0
    [record.c]=1 [prepatch.c]=1 [elfsec.c]=1 [features.c]=1 [features_bits.c]=1 [insn.c]=1 [nop.c]=1 [reloc.c]=1
    [plan.c]=2 [memo.c]=2 [known_plans.c]=2
    [cpu.c]=3 [module.c]=3 [view.c]=3 [prepatch_load.c]=3 [writer.c]=3 [poke.c]=3 [live.c]=3 [flip.c]=3 [frames.c]=3
    [apply.c]=4 [pins.c]=4 [sitecache.c]=4 [debug.c]=4 [image.c]=4 [image_regions.c]=4
)
internal_headers="util.h pure.h plan.h host.h apply.h"

fail=0
bad() {
    echo "layers: $*" >&2
    fail=1
}

# The quoted includes of file $1, one per line.
quoted_includes() {
    sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/p' "$1"
}

check_tools() {
    local dir=$1 f inc base
    while IFS= read -r -d '' f; do
        while IFS= read -r inc; do
            base=${inc##*/}
            case "$inc" in
            *altpatch/src/*) bad "$f includes $inc: tools use the public headers only" ;;
            esac
            for h in $internal_headers internal.h; do
                [ "$base" = "$h" ] && [ ! -e "$(dirname "$f")/$inc" ] &&
                    bad "$f includes the library's internal $inc: tools use the public headers only"
            done
        done < <(quoted_includes "$f")
    done < <(find "$dir" -type f \( -name '*.c' -o -name '*.h' \) -print0)
}

check_src() {
    local dir=$1 f name fl inc ifl
    for f in "$dir"/*.c "$dir"/*.h; do
        [ -e "$f" ] || continue
        name=${f##*/}
        fl=${floor_of[$name]-}
        if [ -z "$fl" ]; then
            case "$name" in
            *.c) bad "$name has no floor: give it one in tests/check_layers.sh and docs/architecture.md" ;;
            *.h) bad "$name is not a floor header (one internal header per floor: $internal_headers)" ;;
            esac
            continue
        fi
        while IFS= read -r inc; do
            [[ "$inc" == *.inc ]] && continue # generated data (features.inc)
            ifl=${floor_of[$inc]-}
            if [ -z "$ifl" ] || [[ "$inc" == *.c ]]; then
                bad "$name (floor $fl) includes \"$inc\", which is not a floor header"
            elif [ "$ifl" -gt "$fl" ]; then
                bad "$name (floor $fl) includes $inc (floor $ifl): a lower floor may not use a higher one"
            fi
        done < <(quoted_includes "$f")
        if [ "$name" != insn.c ] && grep -qE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]Zydis/' "$f"; then
            bad "$name includes Zydis: insn.c is the only file that knows x86 encodings"
        fi
    done
}

# Symbols: who defines what, who uses what.
check_objs() {
    local o name src fl sym
    declare -A def_floor=() def_file=()
    local objs=()
    while IFS= read -r -d '' o; do objs+=("$o"); done < <(find "$@" -name '*.o' -print0)
    [ "${#objs[@]}" -gt 0 ] || { bad "no objects in $*"; return; }
    for o in "${objs[@]}"; do
        name=${o##*/}
        src=${name%.o}
        src=${src%.c}.c
        fl=${floor_of[$src]-}
        [ -n "$fl" ] || { bad "object $name: $src has no floor"; continue; }
        while read -r sym; do
            def_floor[$sym]=$fl
            def_file[$sym]=$src
        done < <(nm --defined-only -g "$o" | awk '$2 ~ /^[TDRBGSVW]$/ && $3 ~ /^(ap_|altpatch_)/ { print $3 }')
    done
    for o in "${objs[@]}"; do
        name=${o##*/}
        src=${name%.o}
        src=${src%.c}.c
        fl=${floor_of[$src]-}
        [ -n "$fl" ] || continue
        while read -r sym; do
            local dfl=${def_floor[$sym]-}
            if [ -n "$dfl" ] && [ "$dfl" -gt "$fl" ]; then
                bad "$src (floor $fl) uses $sym, defined in ${def_file[$sym]} (floor $dfl)"
            fi
        done < <(nm -u "$o" | awk '$2 ~ /^(ap_|altpatch_)/ { print $2 }')
    done
}

case "${1-}" in
--tools)
    [ -d "${2-}" ] || { echo "usage: $0 --tools TOOLS_DIR" >&2; exit 2; }
    check_tools "$2"
    ;;
"" | -*)
    echo "usage: $0 SRC_DIR [OBJ...] | --tools TOOLS_DIR" >&2
    exit 2
    ;;
*)
    [ -d "$1" ] || { echo "$1: not a directory" >&2; exit 2; }
    check_src "$1"
    shift
    if [ "$#" -gt 0 ]; then
        check_objs "$@"
    fi
    ;;
esac
if [ "$fail" -ne 0 ]; then
    exit 1
fi
echo "layers: OK"
