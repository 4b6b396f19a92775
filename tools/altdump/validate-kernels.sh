#!/usr/bin/env bash
# Cross-check altdump on Debian's own kernels (not part of the default tests:
# it downloads ~700 MB). For the newest linux-image-6.1.0-*-cloud-amd64 and
# linux-image-6.12.*+deb12-cloud-amd64 in the apt sources it fetches the
# -unsigned package (modules) and the -dbg package (vmlinux) with
# `apt-get download`, and checks every module with .altinstructions and each
# vmlinux:
#
#   * records == .altinstructions size (readelf) / record size of the version
#     (12 bytes before 6.3, 14 from 6.3);
#   * every record as altdump shows it (feature id, flags, instrlen,
#     replacementlen; for vmlinux also the site and replacement addresses)
#     equals an independent parse of the section bytes (python3, below);
#   * exit status < 3, and no site refused as an unknown feature or flag,
#     for the profiles baseline, amd-zen4, intel-spr and all;
#   * vmlinux 6.12: max RSS (/usr/bin/time -v) <= the file's size and wall
#     time <= 4 s for the table view and --json.
#
# Usage: tools/altdump/validate-kernels.sh [WORKDIR]   (default /tmp/altdump-kernels)
# Environment: ALTDUMP (default build/tools/altdump/altdump),
#              KV61 / KV612 (package versions, e.g. 6.1.0-57 / 6.12.107; default: newest),
#              VMLINUX61=0 to skip the 6.1 vmlinux (its -dbg package is ~280 MB).
# Exit status 0 when every check holds, 1 otherwise.
set -euo pipefail

WORK=${1:-/tmp/altdump-kernels}
ALTDUMP=${ALTDUMP:-$(cd "$(dirname "$0")/../.." && pwd)/build/tools/altdump/altdump}
VMLINUX61=${VMLINUX61:-1}
PROFILES=(baseline amd-zen4 intel-spr all)
[ -x "$ALTDUMP" ] || { echo "validate-kernels: no altdump at $ALTDUMP" >&2; exit 2; }
for t in apt-get apt-cache dpkg-deb readelf python3 xz /usr/bin/time; do
    command -v "$t" >/dev/null || { echo "validate-kernels: $t is missing" >&2; exit 2; }
done
mkdir -p "$WORK"
cd "$WORK"

newest() { apt-cache search --names-only "$1" | awk '{print $1}' | sort -V | tail -n 1; }
KV61=${KV61:-$(newest '^linux-image-6\.1\.0-[0-9]+-cloud-amd64-unsigned$' | sed -E 's/linux-image-(6\.1\.0-[0-9]+)-.*/\1/')}
KV612=${KV612:-$(newest '^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64-unsigned$' | sed -E 's/linux-image-(6\.12\.[0-9]+)\+.*/\1/')}
[ -n "$KV61" ] && [ -n "$KV612" ] || { echo "validate-kernels: no 6.1 / 6.12 cloud kernel in the apt sources" >&2; exit 2; }
PKGS=("linux-image-$KV61-cloud-amd64-unsigned" "linux-image-$KV612+deb12-cloud-amd64-unsigned"
      "linux-image-$KV612+deb12-cloud-amd64-dbg")
[ "$VMLINUX61" = 1 ] && PKGS+=("linux-image-$KV61-cloud-amd64-dbg")
for p in "${PKGS[@]}"; do
    if ! ls "${p}"_*.deb >/dev/null 2>&1; then
        echo "== apt-get download $p"
        apt-get download "$p" >/dev/null
    fi
    if [ ! -d "x/$p" ]; then
        mkdir -p "x/$p"
        dpkg-deb -x "${p}"_*.deb "x/$p"
    fi
done
# 6.12 modules are .ko.xz: decompress next to the tree.
if [ ! -d mods612 ]; then
    mkdir -p mods612.tmp
    find "x/linux-image-$KV612+deb12-cloud-amd64-unsigned" -name '*.ko.xz' | while read -r f; do
        xz -dc "$f" > "mods612.tmp/$(basename "${f%.xz}")"
    done
    mv mods612.tmp mods612
fi

# The independent parse and the comparison with altdump --json.
cat > check.py <<'EOF'
import json, struct, sys
def sections(path):
    d = open(path, 'rb').read()
    shoff, = struct.unpack_from('<Q', d, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', d, 0x3a)
    hdr = [struct.unpack_from('<IIQQQQIIQQ', d, shoff + i * shentsize) for i in range(shnum)]
    so = hdr[shstrndx][4]
    name = lambda o: d[so + o:d.index(b'\0', so + o)].decode()
    return d, {name(h[0]): h for h in hdr}
path, recsize, linked, jfile = sys.argv[1], int(sys.argv[2]), sys.argv[3] == '1', sys.argv[4]
d, secs = sections(path)
h = secs['.altinstructions']
addr, off, size = h[3], h[4], h[5]
raw = d[off:off + size]
recs = []
for i in range(size // recsize):
    p = raw[i * recsize:(i + 1) * recsize]
    io, ro = struct.unpack_from('<ii', p, 0)
    if recsize == 12:
        cpuid, il, rl = struct.unpack_from('<HBB', p, 8)
        feat, flags = cpuid & 0x7fff, (1 if cpuid & 0x8000 else 0)
    else:
        ft, il, rl = struct.unpack_from('<IBB', p, 8)
        feat, flags = ft & 0xffff, ft >> 16
    a = addr + i * recsize
    recs.append((feat, flags, il, rl, a + io, a + 4 + ro))
doc = json.load(open(jfile))
f = doc['files'][0]
errs = []
if f['records'] != size // recsize or size % recsize:
    errs.append('records %d, section %d bytes / %d' % (f['records'], size, recsize))
seen = 0
unknown = 0
for s in f['sites']:
    if s['reason'].startswith('unknown feature') or s['reason'].startswith('unknown record flag') \
            or 'unknown flag' in s['reason'] or 'unknown' in s['detail']:
        unknown += 1
    for e in s['entries']:
        r = recs[e['record']]
        seen += 1
        got = (e['feature_id'], e['flags'], e['instrlen'], e['replacementlen'])
        if got != r[:4]:
            errs.append('record %d: altdump %s, bytes %s' % (e['record'], got, r[:4]))
        if linked and (int(s['address'], 16) != r[4] or int(e['replacement_address'], 16) != r[5]):
            errs.append('record %d: addresses %s/%s, bytes %x/%x' % (e['record'], s['address'],
                        e['replacement_address'], r[4], r[5]))
if seen != len(recs):
    errs.append('altdump shows %d entries of %d records' % (seen, len(recs)))
refused = sum(1 for s in f['sites'] if s['decision'] == 'refused')
reasons = {}
for s in f['sites']:
    if s['decision'] == 'refused':
        reasons[s['reason']] = reasons.get(s['reason'], 0) + 1
print('%d %d %d %d %d %s' % (len(recs), len(f['sites']), refused, unknown, len(errs),
      ','.join('%s=%d' % kv for kv in sorted(reasons.items())) or '-'))
for e in errs[:5]:
    print('  mismatch: ' + e, file=sys.stderr)
EOF

FAIL=0
check_file() { # FILE RECSIZE LINKED -> one line per profile into the totals
    local f=$1 rs=$2 linked=$3 prof rc line
    for prof in "${PROFILES[@]}"; do
        rc=0
        "$ALTDUMP" --json --cpu "$prof" "$f" > out.json 2> err.txt || rc=$?
        if [ "$rc" -ge 3 ]; then
            echo "FAIL $f --cpu $prof: exit $rc: $(head -c 300 err.txt)"
            FAIL=1
            continue
        fi
        line=$(python3 check.py "$f" "$rs" "$linked" out.json) || { FAIL=1; echo "FAIL $f: check.py"; continue; }
        set -- $line
        if [ "$4" != 0 ] || [ "$5" != 0 ]; then
            echo "FAIL $f --cpu $prof: $4 unknown-feature/flag refusals, $5 mismatches"
            FAIL=1
        fi
        echo "$prof $line" >> "totals.$TAG"
    done
}

summary() { # TAG what
    awk -v what="$2" '{ n[$1]++; r[$1]+=$2; s[$1]+=$3; ref[$1]+=$4; unk[$1]+=$5; mm[$1]+=$6 }
        END { for (p in n) printf "  %-22s %-9s files %4d  records %6d  sites %6d  refused %4d  unknown %d  mismatches %d\n",
              what, p, n[p], r[p], s[p], ref[p], unk[p], mm[p] }' "totals.$1" | sort
}

for v in 61 612; do
    TAG=mod$v
    : > "totals.$TAG"
    if [ $v = 61 ]; then dir="x/linux-image-$KV61-cloud-amd64-unsigned"; rs=12; else dir=mods612; rs=14; fi
    total=0 withalt=0
    while read -r ko; do
        total=$((total + 1))
        # (not "readelf | grep -q": under pipefail, readelf's SIGPIPE would skip the file)
        secs=$(readelf -SW "$ko" 2>/dev/null) || true
        [[ $secs == *" .altinstructions "* ]] || continue
        withalt=$((withalt + 1))
        check_file "$ko" $rs 0
    done < <(find "$dir" -name '*.ko' | sort)
    echo "== Linux $( [ $v = 61 ] && echo "$KV61" || echo "$KV612+deb12"): $withalt of $total modules have .altinstructions"
    summary "$TAG" "modules"
done

measure() { # FILE: max RSS and wall of the table view and --json
    local f=$1 size view
    size=$(stat -c %s "$f")
    for view in table json; do
        local args=(--cpu amd-zen4)
        [ $view = json ] && args+=(--json)
        /usr/bin/time -v "$ALTDUMP" "${args[@]}" "$f" > /dev/null 2> time.txt || true
        local rss wall
        rss=$(awk -F': ' '/Maximum resident/ {print $2}' time.txt)
        wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' time.txt)
        echo "  $view: max RSS $((rss / 1024)) MiB for a $((size / 1048576)) MiB file, wall $wall"
        if [ $((rss * 1024)) -gt "$size" ]; then echo "FAIL: max RSS above the file size"; FAIL=1; fi
        python3 - "$wall" <<'EOF' || { echo "FAIL: wall time above 4 s"; FAIL=1; }
import sys
p = sys.argv[1].split(':')
sys.exit(0 if float(p[-1]) + 60 * sum(float(x) * 60 ** i for i, x in enumerate(reversed(p[:-1]))) <= 4 else 1)
EOF
    done
}

for v in 612 61; do
    [ $v = 61 ] && [ "$VMLINUX61" != 1 ] && continue
    if [ $v = 61 ]; then vm=$(ls x/linux-image-$KV61-cloud-amd64-dbg/usr/lib/debug/boot/vmlinux-*); rs=12
    else vm=$(ls x/linux-image-$KV612+deb12-cloud-amd64-dbg/usr/lib/debug/boot/vmlinux-*); rs=14; fi
    TAG=vm$v
    : > "totals.$TAG"
    check_file "$vm" $rs 1
    echo "== $(basename "$vm")"
    summary "$TAG" "vmlinux"
    measure "$vm"
done
[ $FAIL = 0 ] && echo "validate-kernels: all checks hold" || echo "validate-kernels: FAILED"
exit $FAIL
