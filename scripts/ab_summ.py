"""Medians of an A/B sitting's runs (scripts/ab-sitting.sh): before (A) and after (B),
the per-round ratio, and whatever per-side details a sitting's summ.py asks for.

    from ab_summ import summarize
    summarize(DIR, [('sws-cf', 'throughput_MBps', details), ...])

`details(side, runs)` returns a line to print under the row, or None."""
import json, os, statistics as st


def runs_of(d, row):
    """The row's runs per side, for the rounds both sides finished."""
    n = 0
    while all(os.path.exists(f'{d}/{row}-{n + 1}-{s}.json') for s in 'AB'):
        n += 1
    return {s: [json.load(open(f'{d}/{row}-{i}-{s}.json')) for i in range(1, n + 1)] for s in 'AB'}


def summarize(d, rows):
    for row, key, details in rows:
        v = runs_of(d, row)
        if not v['A']:
            continue
        a = [j[key] for j in v['A']]
        b = [j[key] for j in v['B']]
        ratio = [y / x for x, y in zip(a, b)]
        print(f'{row:9} {key}: before {[round(x) for x in a]} median {round(st.median(a))};'
              f' after {[round(x) for x in b]} median {round(st.median(b))};'
              f' after/before per round {[round(r, 2) for r in ratio]} median {st.median(ratio):.2f};'
              f' verify {sorted(set(j["verify"] for s in "AB" for j in v[s]))}')
        for s in 'AB':
            line = details(s, v[s]) if details else None
            if line:
                print(f'   {s} {line}')
