"""Decode attention, the build before (static split in row order) against the build after (tasks
longest context first, taken by free threads), both .so loaded in one process, alternated.

    python ab_builds.py OLD.so NEW.so [NAME=OTHER.so ...]

Others run on 2026-12-06, not landed: per_head=, every (sequence, head) a task of its own, longest
first; whole=, whole sequences, each split into heads only where it alone costs more than a
thread's share.
"""
import importlib.machinery, importlib.util, sys, time
import torch
sys.path.insert(0, '/work/main')
from worker.engine import huge_pages

def load(path):
    name = path.rsplit('/', 1)[1][:-3]
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader)
    mod = importlib.util.module_from_spec(spec); loader.exec_module(mod); return mod

mods = {'before': load(sys.argv[1]), 'after': load(sys.argv[2])}
for extra in sys.argv[3:]:
    name, path = extra.split('=')
    mods[name] = load(path)
Hq, Hkv, D, bs, layers = 9, 3, 64, 16, 30
cases = {'1x1000': [1000], '2x800': [800, 800], '3 mixed': [1200, 300, 200],
         '5 mixed': [900, 800, 300, 200, 100], '8 equal': [500] * 8,
         '3 alike': [880, 870, 860], '5 alike': [900, 880, 870, 860, 850], '9 alike': [700 + 10 * i for i in range(9)],
         '14 mixed': [1500, 1100, 900, 700, 600, 500, 400, 300, 300, 200, 150, 100, 80, 60],
         '40 mixed': [100 + 37 * i for i in range(40)]}
for name, lens_l in cases.items():
    B = len(lens_l); per = [-(-c // bs) for c in lens_l]; mx = max(per)
    nblocks = sum(per) * layers + 8
    kc = huge_pages.zeros((nblocks, Hkv, bs, D), torch.float32); kc.normal_()
    vc = huge_pages.zeros((nblocks, Hkv, bs, D), torch.float32); vc.normal_()
    perm = torch.randperm(nblocks - 8).int()
    tables = []; off = 0
    for l in range(layers):
        t = torch.zeros(B, mx, dtype=torch.int32)
        for b, p in enumerate(per):
            t[b, :p] = perm[off:off + p]; off += p
        tables.append(t)
    lens = torch.tensor(lens_l, dtype=torch.int32); q = torch.randn(B, Hq, D)
    outs = {k: torch.empty_like(q) for k in mods}
    line = []
    for th in (2, 1):
        torch.set_num_threads(th)
        ts = {k: [] for k in mods}
        for r in range(8):
            for k, m in mods.items():
                t0 = time.perf_counter()
                for l in range(layers):
                    m.paged_decode_attention(outs[k], q, kc, vc, tables[l], lens, 0.125)
                ts[k].append(time.perf_counter() - t0)
        assert all(torch.equal(outs['before'], o) for o in outs.values())
        med = {k: sorted(v[1:])[3] * 1e3 for k, v in ts.items()}
        line.append(f"{th} thread(s): " + ' / '.join(f'{k} {v:.2f}' for k, v in med.items()) + ' ms')
    print(f'{name}: ' + '; '.join(line), flush=True)
