import json,sys,collections
a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2]))
assert len(a)==len(b)
def cls(r):
    dec,tok=r[0],r[1]
    pre=tok-dec
    if pre==0:
        return 'dec %s'%('1-9' if dec<10 else '10-15' if dec<16 else '16-31' if dec<32 else '32-79' if dec<80 else '80+')
    return 'mixed tok %s'%('<80' if tok<80 else '80-255' if tok<256 else '256+')
agg=collections.defaultdict(lambda:[0,0.0,0.0,0])
for x,y in zip(a,b):
    assert x[:3]==y[:3]
    c=cls(x); g=agg[c]; g[0]+=1; g[1]+=x[4]-x[3]; g[2]+=y[4]-y[3]; g[3]+=x[1]
ta=sum(g[1] for g in agg.values()); tb=sum(g[2] for g in agg.values())
print(f"{'class':18} steps tokens  A s   B s   A/B  ")
for c in sorted(agg):
    g=agg[c]; print(f"{c:18} {g[0]:5} {g[3]:6} {g[1]:6.2f} {g[2]:6.2f} {g[1]/g[2]:5.2f}")
print('total',round(ta,2),round(tb,2), round(ta/tb,3))
