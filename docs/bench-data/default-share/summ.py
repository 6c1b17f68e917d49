# Medians of sitting.sh's runs, the old defaults (A: 50% share, poor pages passed on)
# against the new (B: 90%, stored), with the resident set, pool and raw pages at the
# end of the measured phase, faults by tier, latency, bytes written and the budget's
# peak per side (scripts/ab_summ.py): python3 summ.py DIR
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../scripts'))
from ab_summ import summarize, pool_details as details

summarize(sys.argv[1], [
    ('pm-cf-513-it', 'accesses_per_s', details),
    ('pm-cf-256', 'accesses_per_s', details),
    ('pm-cf-256-it', 'accesses_per_s', details),
    ('pm-cf-768-it', 'accesses_per_s', details),
    ('sws4k-cf', 'throughput_MBps', details),
    ('sws-cf', 'throughput_MBps', details),
    ('sr-cf', 'throughput_MBps', details),
])
