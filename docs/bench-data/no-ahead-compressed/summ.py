# Medians of sitting.sh's runs, before (A) and after (B), with the resident set and pool
# at the end of the measured phase, faults by tier, latency and the budget's peak per
# side: python3 summ.py DIR
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../scripts'))
from ab_summ import summarize, pool_details as details

summarize(sys.argv[1], [
    ('pm-cf-515', 'accesses_per_s', details),
    ('pm-cf-256', 'accesses_per_s', details),
    ('pm-c-535', 'accesses_per_s', details),
    ('sws-cf', 'throughput_MBps', details),
    ('sr-cf', 'throughput_MBps', details),
    ('sr-cf-random', 'throughput_MBps', details),
])
