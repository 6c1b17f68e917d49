# Medians of sitting.sh's runs, before (A) and after (B), with disk bytes (pswpout) over
# the whole run and the measured passes, clean evictions and the budget's peak per
# side: python3 summ.py DIR
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../scripts'))
from ab_summ import summarize

MIB = 1 << 20


def details(s, js):
    written = [round(x['counters']['pswpout'] * 4096 / MIB) for x in js]
    written_m = [round(x['counters_measured']['pswpout'] * 4096 / MIB) for x in js]
    clean = [x['counters']['clean_evicted'] for x in js]
    peak = max(x['counters']['peak_used_bytes'] for x in js) / MIB
    phases = [[round(p['seconds'], 2) for p in x['phases']] for x in js]
    return (f'written MiB whole {written} measured {written_m}; clean_evicted {clean};'
            f' peak {peak:.1f} MiB; phases {phases}')


summarize(sys.argv[1], [
    ('sws-cf', 'throughput_MBps', details),
    ('sr-cf', 'throughput_MBps', details),
    ('sws-file', 'throughput_MBps', details),
])
