# python3 summ.py DIR: medians per build, B/A per round.
import json, statistics, sys
d = sys.argv[1] if len(sys.argv) > 1 else "."
def runs(path, key, n):
    out = {}
    for v in "AB":
        xs = [json.load(open(path.format(v=v, i=i))) for i in range(1, n + 1)]
        assert all(x["verify"] == "ok" for x in xs)
        out[v] = [x[key] for x in xs]
    return out
rows = [("pmbench 4k compressed+file in-thread, 515 MiB, accesses/s", d + "/pmbench-inthread/{v}-{i}.json", "accesses_per_s", 5),
        ("swap-w-seq 2m compressed+file, 256 MiB, MB/s", d + "/others/sw-{v}-{i}.json", "throughput_MBps", 3),
        ("pmbench 4k file, fault thread, 256 MiB, accesses/s", d + "/others/pm-{v}-{i}.json", "accesses_per_s", 3),
        ("seq-read 4k file, 256 MiB, MB/s", d + "/others/sr-{v}-{i}.json", "throughput_MBps", 3)]
for name, path, key, n in rows:
    r = runs(path, key, n)
    ma, mb = statistics.median(r["A"]), statistics.median(r["B"])
    print(f"{name}: A {round(ma):,} {[round(x) for x in r['A']]}  B {round(mb):,} {[round(x) for x in r['B']]}  "
          f"B/A {mb/ma:.2f}x per round {[round(b/a, 2) for a, b in zip(r['A'], r['B'])]}")
