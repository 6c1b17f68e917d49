#!/usr/bin/env python3
"""Render the raw results of scripts/bench-all.sh (docs/bench-data) as markdown tables.

Prints to stdout; docs/benchmarks.md includes its output verbatim.
"""
import json
import os
import sys

D = sys.argv[1] if len(sys.argv) > 1 else "docs/bench-data"


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
              f"[png](bench-data/{name}.png) |")
w("")
print("\n".join(out))
