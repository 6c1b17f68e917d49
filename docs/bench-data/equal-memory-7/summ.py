# python3 summ.py DIR...: per-run accesses/s of each side, the pairs, medians.
import json, statistics, sys
for d in sys.argv[1:]:
    j = json.load(open(f"{d}/zswap-compressedfile-inthread.json"))
    k = [r["bench"]["accesses_per_s"] for r in j["kernel"]["runs"]]
    u = [r["bench"]["accesses_per_s"] for r in j["uswap"]["runs"]]
    pairs = [b / a for a, b in zip(k, u)]
    print(d, "kernel", [round(x) for x in k], "uswap", [round(x) for x in u],
          "pairs", [round(p, 2) for p in pairs],
          "medians %.0f / %.0f = %.2fx" % (statistics.median(k), statistics.median(u), statistics.median(u) / statistics.median(k)))
if len(sys.argv) > 2:
    ks, us, ps = [], [], []
    for d in sys.argv[1:]:
        j = json.load(open(f"{d}/zswap-compressedfile-inthread.json"))
        k = [r["bench"]["accesses_per_s"] for r in j["kernel"]["runs"]]
        u = [r["bench"]["accesses_per_s"] for r in j["uswap"]["runs"]]
        ks += k; us += u; ps += [b / a for a, b in zip(k, u)]
    print("pooled: kernel %.0f, uswap %.0f, %.2fx; %d of %d pairs >= 1.0, lowest %.2f, median pair %.2f" % (
        statistics.median(ks), statistics.median(us), statistics.median(us) / statistics.median(ks),
        sum(p >= 1.0 for p in ps), len(ps), min(ps), statistics.median(ps)))
