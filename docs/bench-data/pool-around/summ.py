# Medians of sitting.sh's runs, before (A: pages in the pool faulted on one by one) and
# after (B: fault-around from the pool), with the resident set, pool, faults by tier,
# latency, bytes written and the budget's peak per side (scripts/ab_summ.py):
# python3 summ.py DIR
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../scripts'))
from ab_summ import summarize, pool_details as details

summarize(sys.argv[1], [
    ('sws4k-cf', 'throughput_MBps', details),
    ('sws4k-cf-50-pass', 'throughput_MBps', details),
    ('sr4k-cf', 'throughput_MBps', details),
    ('pm-cf-256', 'accesses_per_s', details),
    ('pm-cf-513-it', 'accesses_per_s', details),
])
