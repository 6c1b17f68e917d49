# Medians of sitting.sh's runs, passed on (A, `--incompressible pass`, the default)
# against stored as they are (B, `--incompressible store`), with the resident set and pool at the end of the measured
# phase, faults by tier, latency, bytes written and the budget's peak per side:
# python3 summ.py DIR
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../scripts'))
from ab_summ import summarize

MIB = 1 << 20


def details(s, js):
    cm = [x['counters_measured'] for x in js]
    res = [c['resident_bytes'] // MIB for c in cm]
    pool = [c['zswap_pool_bytes'] // MIB for c in cm]
    raw = [c.get('zswap_stored_incompressible_pages', 0) * 4096 // MIB for c in cm]
    peak = max(x['counters']['peak_used_bytes'] for x in js) / MIB
    line = f'resident MiB {res} pool MiB {pool} (raw pages MiB {raw}); peak {peak:.1f} MiB'
    if js[0]['accesses_per_s'] is not None:
        return line + (f'; pool loads {[c["zswpin"] for c in cm]} file reads {[c["pswpin"] for c in cm]}'
                       f'; p50 {[round(x["lat_p50_us"], 1) for x in js]} p90 {[round(x["lat_p90_us"]) for x in js]}')
    written = [round(x['counters']['pswpout'] * 4096 / MIB) for x in js]
    return line + f'; written MiB {written}; phases {[[round(p["seconds"], 2) for p in x["phases"]] for x in js]}'


summarize(sys.argv[1], [
    ('pm-cf-513', 'accesses_per_s', details),
    ('pm-cf-513-80', 'accesses_per_s', details),
    ('pm-cf-256', 'accesses_per_s', details),
    ('pm-cf-256-it', 'accesses_per_s', details),
    ('sws4k-cf', 'throughput_MBps', details),
    ('sws-cf', 'throughput_MBps', details),
    ('sr-cf', 'throughput_MBps', details),
])
