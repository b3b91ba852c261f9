import json, sys, collections
buckets = [(1, 31), (32, 79), (80, 511), (512, 10**9)]
def load(p):
    out = collections.defaultdict(lambda: [0, 0.0])
    for rec in json.load(open(p)):
        if len(rec) < 5: continue
        dec, tok, ctx, t0, t1 = rec
        for lo, hi in buckets:
            if lo <= tok <= hi:
                out[(lo, hi)][0] += 1; out[(lo, hi)][1] += t1 - t0
    return out
for p in sys.argv[1:]:
    d = load(p)
    print(p.split('/')[-1], ' '.join(f"{lo}-{hi if hi < 10**9 else ''}: {d[(lo,hi)][0]} steps {d[(lo,hi)][1]:.2f}s" for lo, hi in buckets), f"total {sum(v[1] for v in d.values()):.2f}")
