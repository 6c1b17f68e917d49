# Medians of sitting.sh's runs: python3 summ.py DIR
import json, statistics as st, sys
d = sys.argv[1]
def runs(name):
    return [json.load(open(f'{d}/{name}-{i}.json')) for i in (1, 2, 3)]
for tier in ('remote', 'file'):
    s = runs(f'sws-{tier}')
    mb = [j['throughput_MBps'] for j in s]
    print(f'swap-w-seq 2m {tier:6}: MB/s {[round(x) for x in mb]} median {round(st.median(mb))} verify {[j["verify"] for j in s]}')
for tier in ('remote', 'file'):
    p = runs(f'pm-{tier}')
    acc = [j['accesses_per_s'] for j in p]
    p50 = [j['lat_p50_us'] for j in p]
    p99 = [j['lat_p99_us'] for j in p]
    print(f'pmbench {tier:6}: acc/s {[round(x) for x in acc]} median {round(st.median(acc))}'
          f' p50 {[round(x, 1) for x in p50]} median {st.median(p50):.1f}'
          f' p99 {[round(x) for x in p99]} median {st.median(p99):.0f} verify {[j["verify"] for j in p]}')
f = runs('fl-remote')
for k in ('major_fault', 'pread', 'polled_read'):
    v = [j[k]['p50_us'] for j in f]
    print(f'fault-latency remote {k} p50 {[round(x, 1) for x in v]} median {st.median(v):.1f}')
