# Medians of sitting.sh's runs, before (A) and after (B), with disk bytes (pswpout),
# frames recycled and the budget's peak per side: python3 summ.py DIR
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../scripts'))
from ab_summ import summarize

MIB = 1 << 20


def details(s, js):
    written = [round(x['counters']['pswpout'] * 4096 / MIB) for x in js]
    written_m = [round(x['counters_measured']['pswpout'] * 4096 / MIB) for x in js]
    rec = [x['counters'].get('thp_swpin_recycled', 0) for x in js]
    peak = max(x['counters']['peak_used_bytes'] for x in js) / MIB
    line = f'written MiB whole {written} measured {written_m}; recycled {rec}; peak {peak:.1f} MiB'
    if js[0]['accesses_per_s'] is not None:
        return line + f'; p50 {[round(x["lat_p50_us"], 1) for x in js]} p99 {[round(x["lat_p99_us"]) for x in js]}'
    return line + f'; phases {[[round(p["seconds"], 2) for p in x["phases"]] for x in js]}'


summarize(sys.argv[1], [
    ('sws-cf', 'throughput_MBps', details),
    ('sws-file', 'throughput_MBps', details),
    ('pm-cf', 'accesses_per_s', details),
])
