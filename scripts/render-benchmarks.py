#!/usr/bin/env python3
"""The results table at the top of docs/benchmarks.md, and the CSV it is made from.

Raw run output stays out of git: scripts/bench-all.sh writes it under
target/bench-data/<sitting>/. Only the headline of each `--against` run is kept, one row
of docs/bench-results.csv per run.

    render-benchmarks.py collect DIR [--csv FILE]
        Every `uswap bench --against` report (the JSON of `--json`) under DIR becomes a
        row of FILE. DIR/sitting.txt (written by bench-all.sh) gives the date, commit and
        machine. A row with the same key (workload, tier, comparator, size, budget,
        settings) is replaced, so the CSV keeps the latest run of each.
    render-benchmarks.py table [--csv FILE]
        Prints the results table (markdown) that docs/benchmarks.md shows.

FILE defaults to docs/bench-results.csv. One sitting's detailed tables (disk, units,
readahead, ...) come from scripts/render-sitting.py DIR.
"""
import argparse
import csv
import json
import os
import statistics
import sys

CSV = "docs/bench-results.csv"
FIELDS = ["date", "commit", "machine", "workload", "tier", "comparator", "size", "budget",
          "settings", "defaults", "metric", "uswap", "kernel", "ratio", "runs",
          "kernel_oom_runs", "equal_memory", "source", "command", "note"]
KEY = ["workload", "tier", "comparator", "size", "budget", "settings"]
WORKLOADS = ["pmbench", "swap-w-seq", "swap-w-rand", "seq-read", "combined"]
TIERS = ["file", "compressed", "compressed+file"]
COMPARATORS = [("kernel", "kernel swap file"), ("zswap", "zswap + swap file"), ("zram", "zram")]
# The shape the table is about; runs of another shape say theirs in the cell.
SHAPE = ("1G", "256M")

# `uswap bench`'s defaults today: a report's command line (every option spelled out)
# is compared with these, and whatever differs is the run's tuning. Options that did not
# exist when a run was made are simply absent from its command line.
DEFAULTS = {
    "unit": "auto", "readahead": "vma", "ra-stream": "on", "ra-units": "2", "stale-slot": "free",
    "device": "auto", "fault-threads": "1", "spin-us": "0", "io-poll-us": "0",
    "own-read-poll-us": "250", "fault-mode": "handler", "data": "mixed", "compressor": "lz4",
    "incompressible": "store", "read-pct": "80", "threads": "1", "bg-threads": "1",
}
FLAGS = {"fill-memcg", "kernel-ssd", "encrypt", "no-checksums"}
# Not tuning: the measurement's shape and the harness's own bookkeeping.
SHAPE_OPTS = {"size", "budget", "duration", "seed", "memory", "repeat", "plot", "against",
              "tier", "swap-file", "swap-size", "max-swap", "cgroup-limit"}


def iec(n):
    n = int(float(n))
    for unit, sh in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << sh and n % (1 << sh) == 0:
            return f"{n >> sh}{unit}"
    return str(n)


def parse_command(cmd):
    """Options of a report's command line: {name: value or True}, and the workload."""
    toks = cmd.split()
    opts, workload, i = {}, None, toks.index("bench") + 1 if "bench" in toks else 0
    while i < len(toks):
        t = toks[i]
        if t.startswith("--"):
            name = t[2:]
            if i + 1 < len(toks) and not toks[i + 1].startswith("--"):
                opts[name] = toks[i + 1]
                i += 2
                continue
            opts[name] = True
        elif workload is None:
            workload = t
        i += 1
    return workload, opts


def tuning(opts, tier, comparator):
    """The options of a run that differ from today's defaults, as a command-line string."""
    out = []
    for name, value in opts.items():
        if name in SHAPE_OPTS or name == "json":
            continue
        if name in FLAGS:
            out.append(f"--{name}")
        elif name == "compressed-max":
            default = "50" if tier == "compressed" else "90"
            if value != default:
                out.append(f"--{name} {value}")
        elif name == "kernel-page-cluster":
            if comparator in ("zswap", "zram") and value != "0":
                out.append(f"--{name} {value}")
        elif name in DEFAULTS and value != DEFAULTS[name]:
            out.append(f"--{name} {value}")
    return " ".join(sorted(out))


def metric_of(workload):
    return "accesses_per_s" if workload == "pmbench" else "throughput_MBps"


def side_values(reports, side, metric):
    """Every run's value of one side, over reports that each hold one or more runs."""
    vals = []
    for r in reports:
        s = r.get(side) or {}
        runs = s.get("runs") or []
        got = [((x.get("bench") or {}).get(metric)) for x in runs if isinstance(x, dict)]
        got = [v for v in got if v is not None]
        if got:
            vals.extend(got)
        elif (s.get("median") or {}).get(metric) is not None:
            vals.append(s["median"][metric])
    return vals


def row_of(reports, meta):
    """One CSV row from the `--against` reports of one comparison: a single report with
    both sides, or per-side reports (A/B sittings ran each side as its own command)."""
    # The uswap side's command line carries its tuning (per-side reports differ in it).
    first = next((r for r in reports if (r.get("uswap") or {}).get("median") and r.get("command")),
                 next(r for r in reports if r.get("command")))
    workload, opts = parse_command(first["command"])
    workload = first.get("workload") or workload
    tier = opts.get("tier", "file")
    comparator = first.get("against") or opts.get("against")
    metric = metric_of(workload)
    u, k = side_values(reports, "uswap", metric), side_values(reports, "kernel", metric)
    uk = [r for r in reports if (r.get("uswap") or {}).get("median")]
    kk = [r for r in reports if (r.get("kernel") or {}).get("median")]
    # A single report's medians are the harness's; per-side reports: medians of their runs.
    um = (uk[0]["uswap"]["median"].get(metric) if len(uk) == 1 else
          statistics.median(u) if u else None)
    km = (kk[0]["kernel"]["median"].get(metric) if len(kk) == 1 else
          statistics.median(k) if k else None)
    oom = sum((r.get("kernel") or {}).get("oom_killed_runs") or 0 for r in kk)
    settings = tuning(opts, tier, comparator)
    short = " ".join(x for x in [f"uswap bench {workload}", f"--size {iec(first['size'])}",
                                 f"--budget {iec(first['budget'])}",
                                 f"--duration {opts['duration']}" if workload in ("pmbench", "combined", "swap-w-rand") and "duration" in opts else "",
                                 settings, f"--tier {tier}" if tier != "file" else "",
                                 f"--against {comparator}", f"--repeat {max(len(u), len(k))}"] if x)
    return {
        "date": meta["date"], "commit": meta["commit"], "machine": meta["machine"],
        "workload": workload, "tier": tier, "comparator": comparator,
        "size": iec(first["size"]), "budget": iec(first["budget"]),
        "settings": settings, "defaults": "no" if settings else "yes", "metric": metric,
        "uswap": "" if um is None else f"{um:.1f}", "kernel": "" if km is None else f"{km:.1f}",
        "ratio": f"{um / km:.4g}" if um and km else "",
        "runs": f"{len(u)}/{len(k)}", "kernel_oom_runs": str(oom),
        "equal_memory": {True: "yes", False: "no", None: ""}[first.get("equal_memory")],
        "source": meta["source"], "command": short, "note": meta.get("note", ""),
    }


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_csv(path, rows):
    rows = sorted(rows, key=lambda r: (r["date"], r["workload"], r["tier"], r["comparator"]))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def merge(path, new):
    """Add `new` rows to the CSV, each replacing an older row of the same key."""
    keys = {tuple(r[k] for k in KEY) for r in new}
    kept = [r for r in read_csv(path) if tuple(r[k] for k in KEY) not in keys]
    write_csv(path, kept + new)


def sitting_meta(d):
    meta = {}
    try:
        for line in open(os.path.join(d, "sitting.txt")):
            k, _, v = line.partition(":")
            meta[k.strip()] = v.strip()
    except OSError:
        pass
    missing = [k for k in ("date", "commit", "machine") if not meta.get(k)]
    if missing:
        sys.exit(f"{d}/sitting.txt lacks {', '.join(missing)} (scripts/bench-all.sh writes it)")
    return meta


def collect(d, path):
    meta = sitting_meta(d)
    rows = []
    for root, _, files in sorted(os.walk(d)):
        for name in sorted(files):
            if not name.endswith(".json"):
                continue
            p = os.path.join(root, name)
            try:
                with open(p) as f:
                    text = f.read().strip().splitlines()
                rep = json.loads(text[-1]) if text else None
            except (OSError, ValueError):
                continue
            if not (isinstance(rep, dict) and rep.get("against") and "kernel" in rep):
                continue
            if not ((rep.get("kernel") or {}).get("median") and (rep.get("uswap") or {}).get("median")):
                print(f"{p}: one side has no result; not collected", file=sys.stderr)
                continue
            rows.append(row_of([rep], dict(meta, source=os.path.relpath(p, d))))
    if not rows:
        sys.exit(f"no --against report with both sides under {d}")
    merge(path, rows)
    print(f"{len(rows)} rows into {path}", file=sys.stderr)


def fmt(v, metric):
    v = float(v)
    return f"{v:,.0f}" if metric == "accesses_per_s" or v >= 100 else f"{v:,.1f}"


def cell(rows):
    if not rows:
        return "not measured"

    def text(r):
        unit = "accesses/s" if r["metric"] == "accesses_per_s" else "MB/s"
        extra = []
        if (r["size"], r["budget"]) != SHAPE:
            extra.append(f"{r['size']} / {r['budget']}")
        if r["comparator"] != "kernel" and r["equal_memory"] != "yes":
            extra.append("not equal memory")
        if r["kernel_oom_runs"] not in ("", "0"):
            extra.append(f"the harness's \"kernel OOM-killed in {r['kernel_oom_runs']} run(s)\": "
                         "withdrawn pending re-measurement, issue 47 item 6")
        if not r["ratio"]:
            ratio = "—"
        else:
            x = float(r["ratio"])
            ratio = f"{x:.2f}×" if x >= 0.1 else f"{x:.2g}×"
        return (f"{ratio} ({fmt(r['uswap'], r['metric'])} / {fmt(r['kernel'], r['metric'])} {unit}"
                f"; runs {r['runs']}; {r['commit']}, {r['date'][:10]}" + "".join(f"; {e}" for e in extra) + ")")

    dflt = [r for r in rows if r["defaults"] == "yes"]
    if dflt:
        return "**" + text(max(dflt, key=lambda r: r["date"])).replace(" (", "** (", 1)
    # The runs closest to the defaults (fewest tuning options), of their latest date.
    def ntune(r):
        return sum(1 for x in r["settings"].split() if x.startswith("--"))
    fewest = min(ntune(r) for r in rows)
    near = [r for r in rows if ntune(r) == fewest]
    day = max(r["date"][:10] for r in near)
    shown = sorted((r for r in near if r["date"][:10] == day), key=lambda r: (r["settings"], r["date"]))
    latest = max(rows, key=lambda r: r["date"])["commit"]
    return f"not measured with defaults since {latest}; " + "; ".join(
        f"with `{r['settings']}`: {text(r)}" for r in {r["settings"]: r for r in shown}.values())


def table(path):
    rows = read_csv(path)
    if not rows:
        sys.exit(f"{path}: no rows (collect a sitting first)")
    out = ["| workload | tier | " + " | ".join(f"against {label}" for _, label in COMPARATORS) + " |",
           "|---|---|" + "---|" * len(COMPARATORS)]
    for w in WORKLOADS:
        for t in TIERS:
            cells = [cell([r for r in rows if (r["workload"], r["tier"], r["comparator"]) == (w, t, c)])
                     for c, _ in COMPARATORS]
            out.append(f"| {w} | {t} | " + " | ".join(cells) + " |")
    print("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="add a sitting's --against reports to the CSV")
    c.add_argument("dir")
    c.add_argument("--csv", default=CSV)
    t = sub.add_parser("table", help="print the results table")
    t.add_argument("--csv", default=CSV)
    a = ap.parse_args()
    if a.cmd == "collect":
        collect(a.dir, a.csv)
    else:
        table(a.csv)


if __name__ == "__main__":
    main()
