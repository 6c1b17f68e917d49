# Medians of sitting.sh's runs, before (A) and after (B): python3 summ.py DIR
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../scripts'))
from ab_summ import summarize

latency = lambda s, js: f'p50 {[round(j["lat_p50_us"], 1) for j in js]} p99 {[round(j["lat_p99_us"]) for j in js]}'
summarize(sys.argv[1], [
    ('sws-cf', 'throughput_MBps', None),
    ('sws-file', 'throughput_MBps', None),
    ('pm-file', 'accesses_per_s', latency),
])
