# Medians of sitting.sh's runs: python3 summ.py DIR
import glob, json, re, statistics as st, sys
d = sys.argv[1]
MIB = 1 << 20
rows = {}
for f in sorted(glob.glob(f'{d}/*.json')):
    name = re.sub(r'-\d+\.json$', '', f.split('/')[-1])
    rows.setdefault(name, []).append(json.load(open(f)))
for name, js in rows.items():
    key = 'accesses_per_s' if name.startswith('pm') else 'throughput_MBps'
    v = [j[key] for j in js]
    written = [round(j['counters']['pswpout'] * 4096 / MIB) for j in js]
    written_m = [round(j['counters_measured']['pswpout'] * 4096 / MIB) for j in js]
    ratio = [round(j['zswap_ratio'] or 0, 2) for j in js]
    extra = ''
    if key == 'accesses_per_s':
        extra = f' p50 {[round(j["lat_p50_us"], 1) for j in js]}'
    print(f'{name:16} {key} {[round(x) for x in v]} median {round(st.median(v))};'
          f' written MiB whole {written} measured {written_m}; pool ratio {ratio};'
          f' verify {sorted(set(j["verify"] for j in js))}{extra}')
