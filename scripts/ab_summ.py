"""Medians of an A/B sitting's runs (scripts/ab-sitting.sh): before (A) and after (B),
the per-round ratio, and whatever per-side details a sitting's summ.py asks for.

    from ab_summ import summarize
    summarize(DIR, [('sws-cf', 'throughput_MBps', details), ...])

`details(side, runs)` returns a line to print under the row, or None."""
import json, os, statistics as st


def runs_of(d, row):
    """The row's runs per side, for the rounds both sides finished."""
    n = 0
    while all(os.path.exists(f'{d}/{row}-{n + 1}-{s}.json') for s in 'AB'):
        n += 1
    return {s: [json.load(open(f'{d}/{row}-{i}-{s}.json')) for i in range(1, n + 1)] for s in 'AB'}


def summarize(d, rows):
    for row, key, details in rows:
        v = runs_of(d, row)
        if not v['A']:
            continue
        a = [j[key] for j in v['A']]
        b = [j[key] for j in v['B']]
        ratio = [y / x for x, y in zip(a, b)]
        print(f'{row:9} {key}: before {[round(x) for x in a]} median {round(st.median(a))};'
              f' after {[round(x) for x in b]} median {round(st.median(b))};'
              f' after/before per round {[round(r, 2) for r in ratio]} median {st.median(ratio):.2f};'
              f' verify {sorted(set(j["verify"] for s in "AB" for j in v[s]))}')
        for s in 'AB':
            line = details(s, v[s]) if details else None
            if line:
                print(f'   {s} {line}')


MIB = 1 << 20


def pool_details(side, runs):
    """The usual line under a row of a compressed tier's sitting: resident set and pool
    at the end of the measured phase (and the pages stored raw, when any side had
    some), the budget's peak; for pmbench, faults by tier and latency; for the streams,
    bytes written and the phases' seconds."""
    cm = [x['counters_measured'] for x in runs]
    res = [c['resident_bytes'] // MIB for c in cm]
    pool = [c['zswap_pool_bytes'] // MIB for c in cm]
    peak = max(x['counters']['peak_used_bytes'] for x in runs) / MIB
    raw = ''
    if any('zswap_stored_incompressible_pages' in c for c in cm):
        raw = f' (raw pages MiB {[c.get("zswap_stored_incompressible_pages", 0) * 4096 // MIB for c in cm]})'
    line = f'resident MiB {res} pool MiB {pool}{raw}; peak {peak:.1f} MiB'
    if runs[0]['accesses_per_s'] is not None:
        return line + (f'; pool loads {[c["zswpin"] for c in cm]} file reads {[c["pswpin"] for c in cm]}'
                       f'; p50 {[round(x["lat_p50_us"], 1) for x in runs]} p90 {[round(x["lat_p90_us"]) for x in runs]}')
    written = [round(x['counters']['pswpout'] * 4096 / MIB) for x in runs]
    return line + f'; written MiB {written}; phases {[[round(p["seconds"], 2) for p in x["phases"]] for x in runs]}'
