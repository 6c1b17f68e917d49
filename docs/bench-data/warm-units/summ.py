# Medians of sitting.sh's runs, before (A) and after (B): python3 summ.py DIR
import json, os, statistics as st, sys
d = sys.argv[1]
MIB = 1 << 20
for w, key in [('sws-cf', 'throughput_MBps'), ('sws-file', 'throughput_MBps'), ('pm-cf', 'accesses_per_s')]:
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
    for s in 'AB':
        j = v[s]
        written = [round(x['counters']['pswpout'] * 4096 / MIB) for x in j]
        written_m = [round(x['counters_measured']['pswpout'] * 4096 / MIB) for x in j]
        rec = [x['counters'].get('thp_swpin_recycled', 0) for x in j]
        peak = max(x['counters']['peak_used_bytes'] for x in j) / MIB
        line = f'   {s} written MiB whole {written} measured {written_m}; recycled {rec}; peak {peak:.1f} MiB'
        if key == 'accesses_per_s':
            line += f'; p50 {[round(x["lat_p50_us"], 1) for x in j]} p99 {[round(x["lat_p99_us"]) for x in j]}'
        else:
            line += f'; phases {[[round(p["seconds"], 2) for p in x["phases"]] for x in j]}'
        print(line)
