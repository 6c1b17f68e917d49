#!/usr/bin/env python3
"""One sitting's raw results (scripts/bench-all.sh's output directory, under
target/bench-data/) as detailed markdown tables: the disk, units, readahead, the fault
path, tiers, remote, integrity. Prints to stdout, for a commit body or an issue note;
the results table of docs/benchmarks.md comes from scripts/render-benchmarks.py.

    scripts/render-sitting.py target/bench-data/<sitting>
"""
import json
import os
import sys

if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
    sys.exit(f"usage: {sys.argv[0]} DIR (a sitting of scripts/bench-all.sh, under target/bench-data/)")
D = sys.argv[1]


def load(name):
    p = os.path.join(D, name + ".json")
    try:
        with open(p) as f:
            return json.loads(f.read().strip() or "null")
    except (OSError, ValueError):
        return None


def cmd(name):
    try:
        with open(os.path.join(D, name + ".cmd")) as f:
            return f.read().strip()
    except OSError:
        return "(not run)"


def fio(name, rw, job=0):
    p = os.path.join(D, f"fio-{name}.json")
    try:
        j = json.load(open(p))["jobs"][job][rw]
        return j["bw"] * 1024 / 1e6, j["iops"], j["clat_ns"]["percentile"].get("50.000000", 0) / 1000
    except (OSError, ValueError, KeyError):
        return None


def f(v, nd=1):
    return "—" if v is None else f"{v:,.{nd}f}"


def n(v):
    return "—" if v is None else f"{v:,.0f}"


def mib(b):
    return "—" if b is None else f"{b / 2**20:,.0f} MiB"


out = []
w = out.append

w("### The disk (fio, O_DIRECT, io_uring, 2 GiB file, 15 s each, unless said)\n")
w("| test | bandwidth | IOPS | p50 latency |\n|---|---|---|---|")
for name, rw, label in [("seqwrite", "write", "sequential write, 2 MiB blocks, QD4"),
                        ("seqread", "read", "sequential read, 2 MiB blocks, QD4"),
                        ("randread4k", "read", "random read, 4 KiB, QD1")]:
    r = fio(name, rw)
    if r:
        w(f"| {label} | {r[0]:,.0f} MB/s | {r[1]:,.0f} | {r[2]:,.0f} µs |")
mr, mw = fio("seqmixed", "read"), fio("seqmixed", "write")
if mr and mw:
    w(f"| sequential 50/50 read + write, 2 MiB blocks, QD8 | {mr[0]:,.0f} + {mw[0]:,.0f} MB/s | "
      f"{mr[1] + mw[1]:,.0f} | {mr[2]:,.0f} / {mw[2]:,.0f} µs |")
r2r, r2w = fio("seqrw2", "read", 0), fio("seqrw2", "write", 1)
if r2r and r2w:
    w(f"| a sequential reader and a sequential writer at once, 2 MiB blocks, QD4 each | "
      f"{r2r[0]:,.0f} + {r2w[0]:,.0f} MB/s | {r2r[1] + r2w[1]:,.0f} | {r2r[2]:,.0f} / {r2w[2]:,.0f} µs |")
fr0 = fio("seqwrite-fresh", "write")
if fr0:
    w(f"| sequential write, 2 MiB blocks, QD4, one pass over a fresh preallocated 4 GiB file (a new swap file) | "
      f"{fr0[0]:,.0f} MB/s | {fr0[1]:,.0f} | {fr0[2]:,.0f} µs |")
w("")
try:
    rows = [json.loads(l) for l in open(os.path.join(D, "thp-first-touch.jsonl")) if l.strip()]
except (OSError, ValueError):
    rows = []
if rows:
    w("First touch of one 2 MiB THP (`scripts/thp-first-touch.c`, MADV_POPULATE_WRITE or memset, "
      f"{rows[0]['units']} units):\n")
    w("| case | p50 | p90 |\n|---|---|---|")
    for x in rows:
        w(f"| {x['case']} | {x['p50_us']:,.1f} µs | {x['p90_us']:,.1f} µs |")
    w("")

w("### Core runs: 2 GiB region, 256 MiB budget (issue 2)\n")
w("| workload | unit | result | verify | peak RSS | same run in a memcg of budget + 64 MiB, no kernel swap |\n|---|---|---|---|---|---|")
for wl in ["swap-w-seq", "pmbench", "seq-read"]:
    a, m = load(f"core-{wl}"), load(f"core-{wl}-memcg")
    if not a:
        continue
    res = (f"{f(a.get('accesses_per_s'), 0)} accesses/s, p50 {f(a.get('lat_p50_us'))} µs, p99 {f(a.get('lat_p99_us'))} µs"
           if wl == "pmbench" else f"{f(a.get('throughput_MBps'), 0)} MB/s")
    mres = "—"
    if m:
        mres = f"verify {m.get('verify')}, peak RSS {mib(m.get('peak_rss_bytes'))}, not OOM-killed"
    w(f"| {wl} | {a.get('unit')} | {res} | {a.get('verify')} | {mib(a.get('peak_rss_bytes'))} | {mres} |")
w("")

w("### 2 MiB units vs 4 KiB (issue 3): 2 GiB region, 256 MiB budget\n")
w("| workload | unit | MB/s | phases (s) | write requests | avg write size | read requests | avg read size | thp_swpout / fallback | thp_swpin | swap_ra_hit / swap_ra | verify |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
for wl in ["swap-w-seq", "seq-read"]:
    for u in ["4k", "2m", "2m-ra0", "auto"]:
        a = load(f"units-{wl}-{u}")
        if not a:
            continue
        ph = " / ".join(f"{p['seconds']:.2f}" for p in a.get("phases") or [] if p.get("measured"))
        c = a["counters"]
        wr, rd = c.get("write_requests") or 0, c.get("read_requests") or 0
        aw = f"{c['pswpout'] * 4 / wr:,.0f} KiB" if wr else "—"
        ar = f"{c['pswpin'] * 4 / rd:,.0f} KiB" if rd else "—"
        label = "2m, --ra-units 0" if u == "2m-ra0" else u
        w(f"| {wl} | {label} | {f(a.get('throughput_MBps'), 0)} | {ph} | {wr:,} | {aw} | {rd:,} | {ar} | "
          f"{c.get('thp_swpout')} / {c.get('thp_swpout_fallback')} | {c.get('thp_swpin')} | "
          f"{c.get('swap_ra_hit')} / {c.get('swap_ra')} | {a.get('verify')} |")
w("")

# Issue 3's target: 2 MiB units against the disk measured before and after the runs.
fw = [r for r in (fio("seqwrite-before", "write"), fio("seqwrite-after", "write")) if r]
fr = [r for r in (fio("seqread-before", "read"), fio("seqread-after", "read")) if r]
ff = [r for r in (fio("seqwrite-fresh-before", "write"), fio("seqwrite-fresh-after", "write")) if r]
if fw and fr:
    disk_w = sum(r[0] for r in fw) / len(fw)
    disk_r = sum(r[0] for r in fr) / len(fr)
    disk_f = sum(r[0] for r in ff) / len(ff) if ff else None
    w("### Issue 3's target: `--unit 2m` against the disk's own bandwidth\n")
    w(f"fio right before and after these runs (2 MiB blocks, QD4, O_DIRECT): sequential write "
      f"{' / '.join(f'{r[0]:,.0f}' for r in fw)} MB/s (mean {disk_w:,.0f}), sequential read "
      f"{' / '.join(f'{r[0]:,.0f}' for r in fr)} MB/s (mean {disk_r:,.0f})"
      + (f"; sequential write in one pass over a fresh preallocated file (what uswap's swap file is): "
         f"{' / '.join(f'{r[0]:,.0f}' for r in ff)} MB/s (mean {disk_f:,.0f})" if ff else "")
      + ". Budget 256 MiB.\n")
    w("| workload | region | runs | MB/s median (min–max) | % of the disk | % of a fresh file's write | pass 1 / pass 2 s (medians) | verify |\n|---|---|---|---|---|---|---|---|")
    for wl, disk in [("swap-w-seq", disk_w), ("seq-read", disk_r)]:
        for size, k in [("2G", 5), ("4G", 3)]:
            rs = [load(f"headline-{wl}-{size}-{i}") for i in range(1, k + 1)]
            rs = [r for r in rs if r]
            if not rs:
                continue
            v = sorted(r["throughput_MBps"] for r in rs)
            med = v[len(v) // 2]
            p = [sorted(ph["seconds"] for ph in
                        [[q for q in r["phases"] if q.get("measured")][j] for r in rs])[len(rs) // 2]
                 for j in range(2)]
            ok = "ok" if all(r.get("verify") == "ok" for r in rs) else "FAILED"
            w(f"| {wl} | {size.replace('G', ' GiB')} | {len(rs)} | {med:,.0f} ({v[0]:,.0f}–{v[-1]:,.0f}) | "
              f"{100 * med / disk:.0f}% of {'write' if wl == 'swap-w-seq' else 'read'} | "
              f"{f'{100 * med / disk_f:.0f}%' if disk_f and wl == 'swap-w-seq' else '—'} | {p[0]:.2f} / {p[1]:.2f} | {ok} |")
    w("")

w("### Readahead (issue 4): 1 GiB region, 256 MiB budget, 4 KiB units\n")
w("Combined test (seed 004's shape): one thread reads and rewrites region A sequentially, pass after pass, "
  "while one thread writes random pages of region B (512 MiB); 20 s.\n")
w("| policy | seq MB/s | avg | p50 | p60 | p70 | p80 | p90 | p95 | p99 | ra_hit% seq | ra_hit% background | verify |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for ra in ["vma", "cluster"]:
    a = load(f"ra-combined-{ra}")
    if not a:
        continue
    w(f"| {ra} | {f(a.get('throughput_MBps'))} | {f(a.get('lat_avg_us'))} µs | " +
      " | ".join(f"{f(a.get(k))}" for k in ["lat_p50_us", "lat_p60_us", "lat_p70_us", "lat_p80_us", "lat_p90_us", "lat_p95_us", "lat_p99_us"]) +
      f" | {f(a.get('ra_hit_pct_seq'), 2)} | {f(a.get('ra_hit_pct_bg'), 2)} | {a.get('verify')} |")
w("")
w("seq-read with readahead on and off (read phase only; faults per MiB read = (majflt + minflt) / MiB):\n")
w("| readahead | swap-in MB/s | faults per MiB | major faults per MiB | ra_hit% | verify |\n|---|---|---|---|---|---|")
for name, label in [("ra-seq-read-off", "off"), ("ra-seq-read-vma", "vma (kernel window, max 8 pages)"),
                    ("ra-seq-read-vma-stream", "vma + stream growth to 512 pages")]:
    a = load(name)
    if not a:
        continue
    c = a.get("counters_measured") or a["counters"]
    mib_read = 2 * a["size"] / 2**20
    w(f"| {label} | {f(a.get('swapin_MBps'))} | {(c['majflt'] + c['minflt']) / mib_read:,.0f} | {c['majflt'] / mib_read:,.1f} | "
      f"{f(a.get('ra_hit_pct'), 2)} | {a.get('verify')} |")
w("")

w("### Side by side with kernel swap (issue 5): 512 MiB region, 128 MiB budget, medians of 3 alternating runs\n")
w("Kernel: plain anonymous memory in a memcg of budget + 64 MiB with a swap file on the same ext4 "
  "(or zram); uswap: the same workload in a memcg of the same limit, kernel swap off.\n")
w("| backend | unit | workload | kernel | uswap | uswap/kernel | kernel pswpout / thp_swpout / swap_ra_hit | plot |\n|---|---|---|---|---|---|---|---|")
ALL = ["swap-w-seq", "swap-w-rand", "pmbench", "seq-read", "combined"]
for back, units, wls in [("kernel", ["4k", "2m"], ALL),
                         ("kernelssd", ["4k", "2m"], ["swap-w-seq"]),
                         ("zram", ["4k", "2m"], ALL)]:
    for u in units:
        for wl in wls:
            name = f"against-{back}-{u}-{wl}"
            a = load(name)
            if not a:
                continue
            k, us = a.get("kernel", {}), a.get("uswap", {})
            km, um = k.get("median", k), us.get("median", us)
            key = "accesses_per_s" if wl == "pmbench" else "throughput_MBps"
            kv, uv = km.get(key), um.get(key)
            ratio = (uv / kv) if kv and uv else None
            unit_label = "accesses/s" if wl == "pmbench" else "MB/s"
            vm = k.get("counters_median") or {}
            blabel = {"kernel": "swap file", "kernelssd": "swap file, kernel in SSD mode", "zram": "zram"}[back]
            killed = k.get("oom_killed_runs") or 0
            kcell = f"{f(kv, 0)} {unit_label}" if kv is not None else "—"
            if killed:
                kcell += f" (OOM-killed in {killed} of {a.get('repeat')} runs)"
            wlabel = "combined (sequential region)" if wl == "combined" else wl
            w(f"| {blabel} | {u} | {wlabel} | {kcell} | {f(uv, 0)} {unit_label} | "
              f"{f(ratio, 2)}× | {n(vm.get('pswpout'))} / {n(vm.get('thp_swpout'))} / {n(vm.get('swap_ra_hit'))} | "
              f"[png]({name}.png) |")
w("")


def med(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def runs(prefix, k=3):
    return [r for r in (load(f"{prefix}-{i}") for i in range(1, k + 1)) if r]


def verify_all(rs):
    return "ok" if rs and all(r.get("verify") == "ok" for r in rs) else ("—" if not rs else "FAILED")


def against_row(name, label, key):
    a = load(name)
    if not a:
        return None
    k, us = a.get("kernel", {}), a.get("uswap", {})
    km, um = k.get("median", {}), us.get("median", {})
    kv, uv = km.get(key), um.get(key)
    ratio = (uv / kv) if kv and uv else None
    killed = k.get("oom_killed_runs") or 0
    kcell = f(kv, 0) + (f" (OOM-killed {killed}×)" if killed else "")
    lat = ""
    if key == "accesses_per_s":
        lat = (f" | {f(km.get('lat_p50_us'))} / {f(um.get('lat_p50_us'))} µs"
               f" | {f(km.get('lat_p99_us'))} / {f(um.get('lat_p99_us'))} µs")
    return (f"| {label} | {kcell} | {f(uv, 0)} | **{f(ratio, 2)}×**{lat} | "
            f"{f(km.get('memcg_peak_MiB'), 0)} / {f(um.get('memcg_peak_MiB'), 0)} MiB | [png]({name}.png) |")


fl = {m: runs(f"fl-{m}") for m in ["handler", "poll50", "inthread"]}
if any(fl.values()):
    w("### The fault path (issue 18): what one 4 KiB fault costs\n")
    w("`uswap bench fault-latency --size 512M --budget 128M` (4 KiB units): faults on pages swapped "
      "to the file, swap-cache hits, and O_DIRECT 4 KiB preads of the same disk, interleaved in one "
      "run; medians over 3 alternating runs of each run's p50 / p99.\n")
    w("| fault path | major fault p50 / p99 | pread p50 / p99 | major − pread (p50) | swap-cache hit p50 | verify |\n|---|---|---|---|---|---|")
    for m, label in [("handler", "handler thread, blocks in io_uring_enter (default)"),
                     ("poll50", "handler thread, polls its completion queue ≤ 50 µs (`--io-poll-us 50`)"),
                     ("inthread", "the faulting thread itself (`--fault-mode in-thread`, SIGBUS)")]:
        rs = fl[m]
        if not rs:
            continue
        g = lambda part, q: med([r[part][q] for r in rs])
        w(f"| {label} | {f(g('major_fault', 'p50_us'))} / {f(g('major_fault', 'p99_us'))} µs | "
          f"{f(g('pread', 'p50_us'))} / {f(g('pread', 'p99_us'))} µs | "
          f"{f(med([r['major_minus_pread_p50_us'] for r in rs]))} µs | "
          f"{f(g('swapcache_hit', 'p50_us')) if g('swapcache_hit', 'n') else '—'} µs | {verify_all(rs)} |")
    w("")
fm = {m: runs(f"fp-mode-{m}") for m in ["handler", "poll50", "inthread"]}
if any(fm.values()):
    w("pmbench 80/20, 1 GiB / 256 MiB, 4 KiB units, 1 thread, uswap alone, the three paths alternating "
      "(medians of 3):\n")
    w("| fault path | accesses/s | p50 | p99 | verify |\n|---|---|---|---|---|")
    for m, label in [("handler", "handler (default)"), ("poll50", "handler + `--io-poll-us 50`"),
                     ("inthread", "`--fault-mode in-thread`")]:
        rs = fm[m]
        if rs:
            w(f"| {label} | {n(med([r['accesses_per_s'] for r in rs]))} | {f(med([r['lat_p50_us'] for r in rs]))} µs | "
              f"{f(med([r['lat_p99_us'] for r in rs]))} µs | {verify_all(rs)} |")
    w("")
rows = [against_row(f"fp-pmbench-{sz}-t{t}", f"pmbench 80/20, {sz.replace('G', ' GiB')} / {bg}, {t} thread{'s' if t > 1 else ''}",
                    "accesses_per_s") for sz, bg in [("2G", "512 MiB"), ("1G", "256 MiB")] for t in [1, 4]]
rows.append(against_row("fp-pmbench-1G-t1-inthread", "pmbench 80/20, 1 GiB / 256 MiB, 1 thread, `--fault-mode in-thread`", "accesses_per_s"))
rows = [r for r in rows if r]
if rows:
    w("Against the kernel's swap file (same disk, same memcg limit = budget + 64 MiB, medians of 3 "
      "alternating runs per side; kernel / uswap):\n")
    w("| workload | kernel accesses/s | uswap accesses/s | uswap/kernel | p50 kernel / uswap | p99 kernel / uswap | memcg peak | plot |\n|---|---|---|---|---|---|---|---|")
    out.extend(rows)
    w("")
rows = [against_row(nm, lb, "throughput_MBps") for nm, lb in
        [("fp-seq-read-4k", "seq-read, `--unit 4k`, 1 GiB / 256 MiB"),
         ("fp-swap-w-seq-4k", "swap-w-seq, `--unit 4k`, 1 GiB / 256 MiB"),
         ("fp-swap-w-seq-2m", "swap-w-seq, `--unit 2m`, 1 GiB / 256 MiB")]]
rows = [r for r in rows if r]
if rows:
    w("| workload | kernel MB/s | uswap MB/s | uswap/kernel | memcg peak | plot |\n|---|---|---|---|---|---|")
    out.extend(rows)
    w("")

rows = [against_row(f"tiers-pmbench-{t}-{b}", f"{t} against {b}", "accesses_per_s")
        for t, b in [("file", "zswap"), ("compressed+file", "zswap"), ("compressed", "zram"), ("compressed+file", "zram")]]
rows = [r for r in rows if r]
if rows:
    w("### Tiers (issue 12): compressed RAM against zswap and zram\n")
    w("pmbench 80/20, 1 GiB / 256 MiB, 4 KiB units, `--data mixed`, medians of 3 alternating runs per side. "
      "The compressed pool is inside uswap's budget; see the run's header in the `.err` file for how the "
      "kernel side's zram memory was counted.\n")
    w("| uswap tier against kernel | kernel accesses/s | uswap accesses/s | uswap/kernel | p50 kernel / uswap | p99 kernel / uswap | memcg peak | plot |\n|---|---|---|---|---|---|---|---|")
    out.extend(rows)
    w("")
tw = {t: runs(f"tiers-swap-w-seq-2m-{t}") for t in ["file", "compressed+file"]}
if any(tw.values()):
    w("swap-w-seq, `--unit 2m`, 1 GiB / 256 MiB, `--data mixed`, alternating, medians of 3 "
      "(disk writes = pswpout × 4 KiB):\n")
    w("| tier | MB/s | written to disk | zswpout / zswpwb | verify |\n|---|---|---|---|---|")
    for t, rs in tw.items():
        if rs:
            c = lambda k: med([(r.get("counters") or {}).get(k) for r in rs])
            w(f"| {t} | {n(med([r['throughput_MBps'] for r in rs]))} | {mib((c('pswpout') or 0) * 4096)} | "
              f"{n(c('zswpout'))} / {n(c('zswpwb'))} | {verify_all(rs)} |")
    w("")

rf, rw_, rp, ff = runs("remote-fl"), runs("remote-swap-w-seq-2m"), runs("remote-pmbench"), runs("file-fl")
if rf or rw_ or rp:
    w("### Remote tier (issue 14): a local Redis Cluster\n")
    try:
        nodes = open(os.path.join(D, "remote-cluster.txt")).read().split()
    except OSError:
        nodes = []
    w(f"3 primaries + 3 replicas (`scripts/redis-cluster.sh start`), on loopback of the same VM "
      f"({len(nodes)} nodes: {', '.join(nodes)}); medians of 3 alternating runs.\n")
    w("| workload | remote | file tier (same sitting) | verify |\n|---|---|---|---|")
    if rf:
        g = lambda rs, q: med([r["major_fault"][q] for r in rs])
        w(f"| fault-latency, 4 KiB major fault p50 / p99 (256 MiB / 64 MiB) | {f(g(rf, 'p50_us'))} / {f(g(rf, 'p99_us'))} µs | "
          f"{f(g(ff, 'p50_us')) if ff else '—'} / {f(g(ff, 'p99_us')) if ff else '—'} µs | {verify_all(rf)} |")
    if rw_:
        w(f"| swap-w-seq `--unit 2m`, 1 GiB / 256 MiB | {n(med([r['throughput_MBps'] for r in rw_]))} MB/s | — | {verify_all(rw_)} |")
    if rp:
        w(f"| pmbench 80/20, 1 GiB / 256 MiB | {n(med([r['accesses_per_s'] for r in rp]))} accesses/s, p50 "
          f"{f(med([r['lat_p50_us'] for r in rp]))} µs | — | {verify_all(rp)} |")
    w("")

ig = [(wl, lab, key) for wl, lab, key in [("swap-w-seq-2m", "swap-w-seq `--unit 2m`", "throughput_MBps"),
                                          ("pmbench-4k", "pmbench 80/20 `--unit 4k`", "accesses_per_s"),
                                          ("seq-read-2m", "seq-read `--unit 2m`", "throughput_MBps")]]
if any(runs(f"int-{wl}-plain") for wl, _, _ in ig):
    w("### Integrity (issue 17): encryption at rest\n")
    w("1 GiB / 256 MiB, alternating plain / `--encrypt`, medians of 3 (checksums are on in both).\n")
    w("| workload | plain | `--encrypt` | encrypted / plain | verify |\n|---|---|---|---|---|")
    for wl, lab, key in ig:
        a, b = runs(f"int-{wl}-plain"), runs(f"int-{wl}-enc")
        va, vb = med([r.get(key) for r in a]), med([r.get(key) for r in b])
        w(f"| {lab} | {n(va)} | {n(vb)} | {f(vb / va if va and vb else None, 2)}× | {verify_all(a + b)} |")
    w("")

for name, label in [("run-node-bufs", "Node.js, 1,024 Buffers of 1 MiB (`crates/uswap-cli/tests/progs/bufs.js`), `uswap run --budget 256M`"),
                    ("run-numpy-4x", "NumPy, an int64 array 4× the budget (`python/bench/numpy_4x.py --budget 256M`)")]:
    a = load(name)
    if a:
        w(f"- {label}: `{cmd(name)}` → `{json.dumps(a.get('ratio', a.get('ratios')))}` (full JSON in {name}.json)")
w("")
print("\n".join(out))
