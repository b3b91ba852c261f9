import sys, time, statistics, collections, torch
from torch.utils.cpp_extension import load
names = sys.argv[1].split(",")
mods = {n: load(name="pn_attn_" + n, sources=[f"/tmp/attn_exp/attn_{n}.cpp", "/tmp/attn_exp/bind.cpp"],
               extra_cflags=["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp"],
               extra_include_paths=["/tmp/attn_exp"], extra_ldflags=["-fopenmp"], verbose=False) for n in names}
sys.path.insert(0, ".")  # run from the repository root
from worker.engine import huge_pages
for th in (2, 1):
    torch.set_num_threads(th)
    for B, ctx in ((14, 400), (8, 1000), (40, 300)):
        Hq, Hkv, D, bs, layers = 9, 3, 64, 16, 30
        per = -(-ctx // bs); nblocks = B * per * layers
        kc = huge_pages.zeros((nblocks, Hkv, bs, D), torch.float32); kc.normal_()
        vc = huge_pages.zeros((nblocks, Hkv, bs, D), torch.float32); vc.normal_()
        perm = torch.randperm(nblocks)
        q = torch.randn(B, Hq, D); outs = {n: torch.empty_like(q) for n in names}
        tables = [perm[l * B * per:(l + 1) * B * per].view(B, per).int().contiguous() for l in range(layers)]
        lens = torch.full((B,), ctx, dtype=torch.int32)
        T = collections.defaultdict(list)
        for rnd in range(8):
            for n in names:
                f = mods[n].paged_decode_attention; o = outs[n]
                t = time.perf_counter()
                for l in range(layers):
                    f(o, q, kc, vc, tables[l], lens, 0.125)
                T[n].append(time.perf_counter() - t)
        assert all(torch.equal(outs[names[0]], outs[n]) for n in names)
        by = B * ctx * Hkv * D * 4 * 2 * layers
        print(f"th {th} B {B} ctx {ctx}: " + "  ".join(f"{n} {statistics.median(T[n][1:])*1e3:.2f}ms/{by/statistics.median(T[n][1:])/1e9:.1f}" for n in names), flush=True)
