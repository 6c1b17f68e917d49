import json,statistics as st,sys
d0=sys.argv[1]
rows={}
for s in ['k','new']:
    side='kernel' if s=='k' else 'uswap'
    rows[s]=[json.load(open(f'{d0}/{s}-{i}.json'))[side]['runs'][0]['bench'] for i in (1,2,3)]
for s,v in rows.items():
    print(s,[round(b['accesses_per_s']) for b in v],'median',round(st.median([b['accesses_per_s'] for b in v])),'p99',[round(b['lat_p99_us']) for b in v],'verify',[b['verify'] for b in v])
k=st.median([b['accesses_per_s'] for b in rows['k']])
print('ratio',round(st.median([b['accesses_per_s'] for b in rows['new']])/k,3),'per-round',[round(a['accesses_per_s']/b['accesses_per_s'],2) for a,b in zip(rows['new'],rows['k'])])
