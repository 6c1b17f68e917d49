# Summaries of sitting.sh's (and rerun-t1.sh's) runs: python3 summ.py DIR
import json, statistics as st, sys, os
d0 = sys.argv[1]
def load(p, side=None):
    j = json.load(open(p))
    if side:
        run = j[side]['runs'][0]
        b = dict(run['bench'])
        b['memcg_peak_bytes'] = run.get('memcg_peak_bytes') or 0
        b['memcg_limit_hits'] = run.get('memcg_limit_hits')
        return b
    return j
for w in ['pmbench-1G-t1', 'pmbench-1G-t4', 'pmbench-2G-t1', 'pmbench-2G-t4']:
    n = 0
    while all(os.path.exists(f'{d0}/{w}/{s}-{n + 1}.json') for s in ('k', 'p0', 'p250')):
        n += 1
    if n == 0:
        continue
    rows = {}
    for s in ['k', 'p0', 'p250']:
        side = 'kernel' if s == 'k' else 'uswap'
        rows[s] = [load(f'{d0}/{w}/{s}-{i}.json', side) for i in range(1, n + 1)]
    print(f'== {w}')
    for s, v in rows.items():
        acc = [b['accesses_per_s'] for b in v]
        print(f'  {s:5} acc {[round(x) for x in acc]} median {round(st.median(acc))}'
              f' p50 {[round(b["lat_p50_us"],1) for b in v]} p99 {[round(b["lat_p99_us"],1) for b in v]}'
              f' verify {[b["verify"] for b in v]} memcg_peak_MiB {[round(b["memcg_peak_bytes"]/2**20) for b in v]} limit_hits {[b["memcg_limit_hits"] for b in v]}')
    k = st.median([b['accesses_per_s'] for b in rows['k']])
    for s in ['p0', 'p250']:
        per = [a['accesses_per_s'] / b['accesses_per_s'] for a, b in zip(rows[s], rows['k'])]
        print(f'  {s} / kernel: median-of-medians {st.median([b["accesses_per_s"] for b in rows[s]]) / k:.3f}'
              f' per-round {[round(x, 2) for x in per]} median-per-round {st.median(per):.2f}'
              f' p99 median {st.median([b["lat_p99_us"] for b in rows[s]]):.0f} vs kernel {st.median([b["lat_p99_us"] for b in rows["k"]]):.0f}')
for sub, pre in [('fl', 'file'), ('remote', 'fl')]:
    for v in (0, 250):
        runs = [load(f'{d0}/{sub}/{pre}-p{v}-{i}.json') for i in (1, 2, 3) if os.path.exists(f'{d0}/{sub}/{pre}-p{v}-{i}.json')]
        if not runs:
            continue
        f = lambda k: [round(r[k]['p50_us'], 1) for r in runs]
        print(f'== fault-latency {sub} poll {v}: major p50 {f("major_fault")} pread {f("pread")} polled {f("polled_read")}'
              f' major-pread {[round(r["major_minus_pread_p50_us"],1) for r in runs]} median {st.median([r["major_minus_pread_p50_us"] for r in runs]):.1f}'
              f' major-polled {[round(r["major_minus_polled_read_p50_us"],1) for r in runs]} median {st.median([r["major_minus_polled_read_p50_us"] for r in runs]):.1f}'
              f' major median {st.median([r["major_fault"]["p50_us"] for r in runs]):.1f} verify {[r["verify"] for r in runs]}')
for v in (0, 250):
    runs = []
    for i in (1, 2, 3):
        p = f'{d0}/remote/pm-p{v}-{i}.json'
        if os.path.exists(p):
            j = load(p)
            runs.append(j['bench'] if 'bench' in j else j)
    if runs:
        print(f'== remote pmbench poll {v}: acc {[round(b["accesses_per_s"]) for b in runs]} p50 {[round(b["lat_p50_us"],1) for b in runs]}'
              f' p99 {[round(b["lat_p99_us"],1) for b in runs]} verify {[b["verify"] for b in runs]}')
for n in ['sws-2m', 'sws-4k', 'seq-read-4k']:
    p = f'{d0}/handler/{n}.json'
    if os.path.exists(p):
        j = load(p)
        ks = [r['bench']['throughput_MBps'] for r in j['kernel']['runs']]
        us = [r['bench']['throughput_MBps'] for r in j['uswap']['runs']]
        print(f'== {n}: kernel {[round(x) for x in ks]} uswap {[round(x) for x in us]} ratio of medians {st.median(us)/st.median(ks):.2f}'
              f' verify {[r["bench"]["verify"] for r in j["uswap"]["runs"]]}')
