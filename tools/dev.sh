#!/usr/bin/env bash
# Developer entry point (README "Quick start"; .ci/run calls `tools/dev.sh test`).
#
#   tools/dev.sh demo   install what is missing, build into build/, run the demo
#   tools/dev.sh test   install what is missing, then:
#                         build/        (gcc, RelWithDebInfo)  ctest, every test
#                         build-asan/   (-DALTPATCH_SANITIZE=ON: ASan + UBSan)
#                                       ctest without the tests labelled
#                                       "valgrind" or "nosanitize"
#                         build-clang/  (CC=clang) build only: warning-free under clang
#
# Packages: Debian 12 names. As root, missing ones are installed with apt-get;
# as another user, a missing package is an error that names it.
# Environment: CC (compiler of build/ and build-asan/), JOBS (default: nproc),
# CTEST_JOBS (default: 2).
set -euo pipefail

cd "$(dirname "$0")/.."

PACKAGES=(
    build-essential cmake pkg-config
    libzydis-dev libelf-dev libcriterion-dev
    clang libclang-rt-14-dev llvm
    valgrind qemu-user file binutils
)
JOBS=${JOBS:-$(nproc)}
CTEST_JOBS=${CTEST_JOBS:-2}

log() { printf '\n==> [%s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf 'tools/dev.sh: %s\n' "$*" >&2; exit 1; }

missing_packages() {
    local p
    for p in "${PACKAGES[@]}"; do
        if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != installed ]; then
            printf '%s\n' "$p"
        fi
    done
}

ensure_packages() {
    if ! command -v dpkg-query >/dev/null; then
        log "no dpkg-query: not Debian, assuming these are installed: ${PACKAGES[*]}"
        return
    fi
    local missing
    mapfile -t missing < <(missing_packages)
    [ "${#missing[@]}" -eq 0 ] && return
    if [ "$(id -u)" -ne 0 ]; then
        die "missing packages: ${missing[*]}
run as root, or: sudo apt-get install --no-install-recommends ${missing[*]}"
    fi
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "${missing[@]}"
}

# configure DIR [cmake options...]
configure() {
    local dir=$1
    shift
    log "configure $dir $*"
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
}

# build DIR [cmake options...]: configure and build every target.
build() {
    configure "$@"
    log "build $1"
    cmake --build "$1" -j "$JOBS"
}

# Totals over every ctest run, for the closing "N passed, N failed" line.
PASSED=0
FAILED=0

run_ctest() {
    local dir=$1 out rc=0 line total failed
    shift
    log "ctest $dir $*"
    out=$(mktemp)
    ctest --test-dir "$dir" --output-on-failure -j "$CTEST_JOBS" "$@" 2>&1 | tee "$out" || rc=$?
    # "100% tests passed, 0 tests failed out of 48"
    line=$(grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "$out" | tail -n 1 || true)
    rm -f "$out"
    if [ -n "$line" ]; then
        failed=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$line")
        total=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\2/' <<<"$line")
        PASSED=$((PASSED + total - failed))
        FAILED=$((FAILED + failed))
    fi
    if [ "$rc" -ne 0 ]; then
        echo "ctest: $PASSED passed, $FAILED failed"
        return "$rc"
    fi
}

cmd_demo() {
    ensure_packages
    configure build
    log "build build (altdemo)"
    cmake --build build -j "$JOBS" --target altdemo
    log "build/tools/altdemo/altdemo"
    build/tools/altdemo/altdemo
}

cmd_test() {
    local t0=$SECONDS
    ensure_packages
    build build
    run_ctest build
    # Valgrind and the sanitizers do not mix; tests that cannot run
    # instrumented (e.g. -static fixtures) carry the label "nosanitize".
    build build-asan -DALTPATCH_SANITIZE=ON
    ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1} \
        UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
        run_ctest build-asan -LE '^(valgrind|nosanitize)$'
    CC=clang build build-clang
    log "all done in $((SECONDS - t0)) s"
    echo "ctest: $PASSED passed, $FAILED failed"
}

case "${1:-}" in
    demo) cmd_demo ;;
    test) cmd_test ;;
    *) die "usage: tools/dev.sh demo|test" ;;
esac
