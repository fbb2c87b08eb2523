"""Python emulation of the round-2 vocabulary pass (csrc/tree_build_vocab.h): the radix select with varying-bit
windows and the tie-keeping stop, the streamed admission with strict thresholds, split + merge; exact against a
sort on 400 key sets and 30 rows. Run: python3 select_emulation.py (prints ok / stream ok).
It has the `shift>=32` guard the CUDA code lacked (the H200 tie failures): the device-granular emulation that
reproduces them is tests/tree_build_vocab_emulation.py."""
import numpy as np, random
M64=(1<<64)-1
def clz(x): return 64-x.bit_length()
def select(keys,k,slack):
    o=0;a=M64
    for x in keys: o|=x;a&=x
    vary=o^a; common=a
    prefix=0;mask=0;krem=k
    while vary & ~mask & M64:
        hi=63-clz(vary & ~mask & M64)
        shift=max(hi-7, 32 if hi>=32 else 0)
        dmask=(2<<(hi-shift))-1
        hist=[0]*256
        for x in keys:
            if x & mask == prefix: hist[(x>>shift)&dmask]+=1
        incl=0
        for b in range(255,-1,-1):
            c=hist[b]; incl+=c
            if c>0 and incl>=krem and incl-c<krem: sd,sa,sb=b,incl-c,c
        prefix|=sd<<shift; mask|=dmask<<shift; krem-=sa
        if sb==krem: return prefix|(common&~vary&~mask&M64), k
        if slack>0 and shift>=32 and ((vary&~mask&M64)>>32)==0 and sb-krem<=slack:
            return (prefix|(common&~vary&~mask&M64))&0xffffffff00000000, k-krem+sb
    raise Exception("unreachable")
def okey(f):
    u=int(np.float32(f).view(np.uint32))
    return (~u)&0xffffffff if u&0x80000000 else u|0x80000000
def key(f,i):
    if f==0: f=0.0
    return (okey(f)<<32)|((~i)&0xffffffff)
rng=np.random.default_rng(1)
for t in range(400):
    n=int(rng.integers(2,3000)); k=int(rng.integers(1,min(n,1024)+1))
    kind=t%5
    if kind==0: v=rng.normal(0,3,n)
    elif kind==1: v=rng.integers(-4,5,n)*0.5
    elif kind==2: v=np.full(n,-1.25)
    elif kind==3: v=rng.normal(0,3,n); v[rng.random(n)<.4]=-np.inf
    else: v=-np.abs(rng.normal(0,3,n))
    dt = np.float32 if t%2 else None
    v=v.astype(np.float32)
    if t%2==0: v=(v.view(np.uint32)&0xffff0000).view(np.float32)  # bf16-like
    ids=rng.permutation(200000)[:n]
    keys=[key(float(x),int(i)) for x,i in zip(v,ids)]
    slack=k//2 if t%3 else 0
    T,kept=select(keys,k,slack)
    cnt=sum(1 for x in keys if x>=T)
    assert cnt==kept,(t,cnt,kept,kind)
    srt=sorted(keys,reverse=True)
    assert kept>=k and (slack>0 or kept==k),(t,kept,k)
    assert all(x>=T for x in srt[:k])
    if kept>k: # ties: extra keys share the k-th key's value
        assert len({x>>32 for x in srt[k-1:kept]})==1
print("ok")

def stream(v, c0, c1, k, chunk=4096, compact=2048):
    held=[]; thr=-np.inf
    for c in range(c0,c1):
        for i in range(c*chunk, min((c+1)*chunk, len(v))):
            if v[i]>=thr: held.append(key(float(v[i]),i))
        if len(held)>compact:
            T,kept=select(held,k,k//2); held=[x for x in held if x>=T]; assert len(held)==kept
            tv=np.uint32(T>>32); tv=int(tv)
            f=np.array([(tv&0x7fffffff) if tv&0x80000000 else (~tv)&0xffffffff],dtype=np.uint32).view(np.float32)[0]
            if np.isnan(f): f=-np.inf
            thr=np.nextafter(np.float32(f),np.float32(np.inf)) if kept==k else f
    if len(held)>k:
        T,kept=select(held,k,0); held=[x for x in held if x>=T]
    return sorted(held,reverse=True)
def merge(lists,k):
    allk=[x for l in lists for x in l if x]
    held=[];thr=1
    for b in range(0,len(allk),4096):
        held+= [x for x in allk[b:b+4096] if x>=thr]
        if len(held)>2048:
            T,_=select(held,k,0); held=[x for x in held if x>=T]; thr=max(thr,T)
    if len(held)>k:
        T,_=select(held,k,0); held=[x for x in held if x>=T]
    return sorted(held,reverse=True)
for t in range(30):
    V=int(rng.choice([5003, 20000, 40961, 50])); k=int(min(V, rng.choice([1,7,64,256,1024])))
    kind=t%3
    v=(rng.normal(0,3,V) if kind==0 else rng.integers(-4,5,V)*0.5 if kind==1 else np.sort(rng.normal(0,3,V))).astype(np.float32)
    v=(v.view(np.uint32)&0xffff0000).view(np.float32)
    want=sorted([key(float(x),i) for i,x in enumerate(v)],reverse=True)[:k]
    nch=-(-V//4096)
    assert stream(v,0,nch,k)==want, t
    for cps in (1,2,3):
        S=-(-nch//cps)
        lists=[stream(v,s*cps,min(nch,(s+1)*cps),k) for s in range(S)]
        assert merge(lists,k)==want,(t,cps)
print("stream ok")
