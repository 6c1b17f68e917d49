import json,statistics as st,sys
d0=sys.argv[1]
rows={}
for s in ['k','fixed','fill']:
    side='kernel' if s=='k' else 'uswap'
    for i in (1,2,3):
        b=json.load(open(f'{d0}/{s}-{i}.json'))[side]['runs'][0]['bench']
        cm=b.get('counters_measured',{})
        rows.setdefault(s,[]).append(b)
metric=sys.argv[2] if len(sys.argv)>2 else 'accesses_per_s'
for s,v in rows.items():
    vals=[b[metric] for b in v]
    print(s, metric, [round(x) for x in vals], 'median', round(st.median(vals)), 'p50',[round(b['lat_p50_us'],1) if b.get('lat_p50_us') else None for b in v],'p99',[round(b['lat_p99_us'],1) if b.get('lat_p99_us') else None for b in v], 'verify',[b['verify'] for b in v], 'zero', [b['counters_measured'].get('swpout_zero') for b in v], 'pswpout',[b['counters_measured'].get('pswpout') for b in v])
k=st.median([b[metric] for b in rows['k']])
for s in ['fixed','fill']:
    print(s,'ratio',round(st.median([b[metric] for b in rows[s]])/k,3),'per-round',[round(a[metric]/b[metric],2) for a,b in zip(rows[s],rows['k'])])
