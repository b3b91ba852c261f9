import sys, time, collections
sys.path.insert(0,'.')
from ops.bench import engine
from worker.attention.cpu_backend import CpuAttentionBackend
from worker.models import quant
T=collections.Counter()
def wrap(cls,name,key):
    f=getattr(cls,name)
    def w(*a,**k):
        t=time.perf_counter(); r=f(*a,**k); T[key]+=time.perf_counter()-t; return r
    setattr(cls,name,w)
wrap(CpuAttentionBackend,'prefill','prefill_attn')
wrap(CpuAttentionBackend,'decode','decode_attn_py')
wrap(quant.QuantWeight,'linear','qlinear_many')
engine.main(sys.argv[1:])
print({k:round(v,2) for k,v in T.items()})
