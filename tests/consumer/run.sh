#!/bin/sh
# Install an altpatch build tree into a temporary prefix, then build and run
# tests/consumer against that prefix twice:
#   1. CMake: find_package(altpatch) through CMAKE_PREFIX_PATH
#      (consumer_shared -> altpatch::altpatch, consumer_static -> altpatch::altpatch_static);
#   2. pkg-config: PKG_CONFIG_PATH and a plain cc command line;
# then builds the tools (altprepatch, altbench, altdump) from their sources
# against the installed headers and library only, as any user's tool.
# Run by ctest (tests/install.cmake):
#   run.sh BUILD_DIR SOURCE_DIR WORK_DIR LIBDIR CC [C flags...]
set -eu
[ $# -ge 5 ] || { echo "usage: $0 BUILD_DIR SOURCE_DIR WORK_DIR LIBDIR CC [CFLAGS...]" >&2; exit 2; }
build=$1 src=$2 work=$3 libdir=$4 cc=$5
shift 5
cflags="$*"
prefix=$work/prefix
consumer=$src/tests/consumer

# The consumer must see the default behaviour of the library.
unset ALTPATCH_OFF ALTPATCH_CLEARCPUID ALTPATCH_DEBUG || true

step() { echo "== $*"; }

rm -rf "$work"
mkdir -p "$work"

step "install $build -> $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || {
    cat "$work/install.log" >&2; exit 1; }
for f in include/altpatch/altpatch.h include/altpatch/alternative.h \
         include/altpatch/cpufeatures.h include/altpatch/primitives.h \
         include/altpatch/image.h bin/altprepatch share/man/man1/altprepatch.1 \
         "$libdir/libaltpatch.a" "$libdir/libaltpatch.so" \
         "$libdir/cmake/altpatch/altpatchConfig.cmake" \
         "$libdir/cmake/altpatch/altpatchConfigVersion.cmake" \
         "$libdir/pkgconfig/altpatch.pc"; do
    [ -e "$prefix/$f" ] || { echo "not installed: $f" >&2; exit 1; }
done
soname=$(readelf -d "$prefix/$libdir/libaltpatch.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ -n "$soname" ] && [ -e "$prefix/$libdir/$soname" ] || {
    echo "SONAME '$soname' missing in $prefix/$libdir" >&2; exit 1; }

export LD_LIBRARY_PATH="$prefix/$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# Fails unless $1 loads libaltpatch from the prefix (or, static, not at all).
check_loads_prefix() {
    lib=$(ldd "$1" | awk '/libaltpatch/ { print $3 }')
    case "$2:$lib" in
        shared:"$prefix/$libdir/$soname") ;;
        static:) ;;
        *) echo "$1 loads libaltpatch from '$lib' (expected $2 from $prefix)" >&2; exit 1 ;;
    esac
}

step "find_package(altpatch) with CMAKE_PREFIX_PATH=$prefix"
cmake -S "$consumer" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$cflags" -DCMAKE_BUILD_TYPE=Release \
      >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/cmake" >>"$work/cmake.log" 2>&1 || { cat "$work/cmake.log" >&2; exit 1; }
check_loads_prefix "$work/cmake/consumer_shared" shared
check_loads_prefix "$work/cmake/consumer_static" static
"$work/cmake/consumer_shared"
"$work/cmake/consumer_static"

step "pkg-config with PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig"
export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
pkg-config --exists --print-errors altpatch
pcflags=$(pkg-config --cflags altpatch)
pclibs=$(pkg-config --libs altpatch)
echo "cflags: $pcflags"
echo "libs:   $pclibs"
mkdir -p "$work/pc"
# shellcheck disable=SC2086 # word splitting of the flags is intended
"$cc" -std=gnu11 $cflags $pcflags "$consumer/consumer.c" -o "$work/pc/consumer" $pclibs -lpthread
check_loads_prefix "$work/pc/consumer" shared
"$work/pc/consumer"

step "altprepatch from its source, against the installed headers only"
# shellcheck disable=SC2086
"$cc" -std=gnu11 $cflags $pcflags "$src/tools/altprepatch/altprepatch.c" \
      "$src/tools/common/cpuspec.c" \
      -o "$work/pc/altprepatch" $pclibs -lpthread
"$work/pc/altprepatch" --cpu baseline "$work/pc/consumer" "$work/pc/consumer.baseline"
readelf -SW "$work/pc/consumer.baseline" | grep -q '\.altpatch\.orig' || {
    echo "altprepatch wrote no .altpatch.orig section" >&2; exit 1; }
step "altbench from its source, against the installed headers and library only"
ab=$src/tools/altbench
elfflags=$(pkg-config --cflags --libs libelf 2>/dev/null || echo -lelf)
# shellcheck disable=SC2086
"$cc" -std=gnu11 -D_GNU_SOURCE $cflags $pcflags "$ab/altbench.c" "$ab/insn.c" "$ab/sites.c" \
      "$ab/dispatch.c" "$ab/size.c" "$ab/scaling.c" "$ab/startup.c" "$src/tools/common/berkeley.c" \
      -o "$work/pc/altbench" $pclibs $elfflags -lpthread
check_loads_prefix "$work/pc/altbench" shared
"$work/pc/altbench" size "$work/pc/consumer" "$work/pc/consumer" 1 >"$work/pc/altbench.size"
grep -q '^| difference | 0 | 0 | 0 | 0 |$' "$work/pc/altbench.size" || {
    cat "$work/pc/altbench.size" >&2; echo "altbench size: a file against itself must differ by 0" >&2; exit 1; }
step "altdump from its source, against the installed headers and library (libelf, Zydis)"
ad=$src/tools/altdump
# shellcheck disable=SC2086
"$cc" -std=gnu11 -D_GNU_SOURCE $cflags $pcflags "$ad"/elfread.c "$ad"/symbols.c "$ad"/decide.c \
      "$ad"/text.c "$ad"/json.c "$ad"/size.c "$ad"/pidmem.c "$ad"/prepatched.c "$ad"/kernel.c \
      "$ad"/kfeatures.c "$ad"/disasm.c "$ad"/main.c "$src/tools/common/berkeley.c" \
      "$src/tools/common/cpuspec.c" \
      -o "$work/pc/altdump" $pclibs $elfflags -lZydis -lZycore -lpthread
check_loads_prefix "$work/pc/altdump" shared
"$work/pc/altdump" --cpu baseline "$work/pc/consumer" >"$work/pc/altdump.out"
"$work/pc/altdump" --check "$work/pc/consumer.baseline" >"$work/pc/altdump.check"
grep -q ', 0 refused$' "$work/pc/altdump.out" &&
grep -q ': ok, .* pre-patched for baseline$' "$work/pc/altdump.check" || {
    cat "$work/pc/altdump.out" "$work/pc/altdump.check" >&2
    echo "altdump built on the installed library misread the consumer" >&2; exit 1; }
echo "== install + consumer: OK"
