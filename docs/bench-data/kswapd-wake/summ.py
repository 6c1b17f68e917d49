# Medians of sitting.sh's runs, before (A) and after (B): python3 summ.py DIR
import json, os, statistics as st, sys
d = sys.argv[1]
for w, key in [('sws-cf', 'throughput_MBps'), ('sws-file', 'throughput_MBps'), ('pm-file', 'accesses_per_s')]:
    n = 0
    while all(os.path.exists(f'{d}/{w}-{n + 1}-{s}.json') for s in 'AB'):
        n += 1
    if not n:
        continue
    v = {s: [json.load(open(f'{d}/{w}-{i}-{s}.json')) for i in range(1, n + 1)] for s in 'AB'}
    a = [j[key] for j in v['A']]
    b = [j[key] for j in v['B']]
    ratio = [y / x for x, y in zip(a, b)]
    print(f'{w:9} {key}: before {[round(x) for x in a]} median {round(st.median(a))};'
          f' after {[round(x) for x in b]} median {round(st.median(b))};'
          f' after/before per round {[round(r, 2) for r in ratio]} median {st.median(ratio):.2f};'
          f' verify {sorted(set(j["verify"] for s in "AB" for j in v[s]))}')
    if w == 'pm-file':
        for s in 'AB':
            print(f'   {s} p50 {[round(j["lat_p50_us"], 1) for j in v[s]]} p99 {[round(j["lat_p99_us"]) for j in v[s]]}')
