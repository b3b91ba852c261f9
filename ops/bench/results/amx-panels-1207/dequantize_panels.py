import time, torch, sys
sys.path.insert(0,'.')
from kernels import cpu_ops, quant_reference as qr
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv)>1 else 1)
ops=cpu_ops.load()
g=torch.Generator().manual_seed(0)
for fmt,(n,k) in [(qr.Q4_1,(1536,576)),(qr.Q4_1,(576,1536)),(qr.Q8_0,(1536,576))]:
    nb=k//32
    b=torch.randint(0,256,(n,nb,fmt.block_bytes),dtype=torch.uint8,generator=g)
    b[...,:fmt.head_bytes]=(torch.rand(n,nb,2,generator=g)*0.02).half().view(torch.uint8).reshape(n,nb,4)[...,:fmt.head_bytes]
    b=b.reshape(n,-1); p=qr.pack_panels(b,fmt.type_id,16)
    for bf16 in (True,False):
        res={}
        for name,(data,pr) in {'file':(b,0),'panels':(p,16)}.items():
            for _ in range(20): ops.gguf_dequantize(data,fmt.type_id,bf16,pr)
            best=1e9
            for r in range(5):
                t=time.perf_counter()
                for _ in range(50): ops.gguf_dequantize(data,fmt.type_id,bf16,pr)
                best=min(best,(time.perf_counter()-t)/50)
            res[name]=best*1e6
        print(fmt.name,n,k,'bf16' if bf16 else 'fp32',{k:round(v,1) for k,v in res.items()}, 'us')
