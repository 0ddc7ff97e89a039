"""How small a calibration set makes prior adaptation harmful: EM (Saerens et al. 2002) with the source prior
estimated as the mean calibrated probability of m labelled rows per class, on 10 Gaussian classes with exact
posteriors and NO label shift (target prior = source prior), so any change of the target NLL is harm.
Prints, per m: the median and 90th percentile of the NLL increase over 400 calibration draws, and the share
of draws with an increase above 5 % (Wald half-width; the results file gives Wilson intervals).
Run: python benchmarks/adapt_small_calibration.py  (numpy only, ~1 min)."""
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "adaptation"))
from _synth import draw, posterior
K=10; sep=2.0; ps=np.full(K,1/K); rng=np.random.default_rng(1)
def em(p, ps_hat, it=500):
    pi=ps_hat.copy()
    for _ in range(it):
        q=p*(pi/ps_hat); q/=q.sum(1,keepdims=True); new=q.mean(0)
        if np.abs(new-pi).sum()<1e-8: pi=new; break
        pi=new
    return pi
xt,yt=draw(ps,5000,rng,sep); pt=posterior(xt,ps,sep)
nll0=-np.log(pt[np.arange(len(yt)),yt]).mean()
for m in (1,2,3,5,10,20,30,50,100):
    harm=[]; l1=[]
    for r in range(400):
        y=np.repeat(np.arange(K),m); x=np.eye(K)[y]*sep+rng.normal(size=(K*m,K))
        ps_hat=posterior(x,ps,sep).mean(0)
        pi=em(pt,ps_hat)
        q=pt*(pi/ps_hat); q/=q.sum(1,keepdims=True)
        harm.append(-np.log(q[np.arange(len(yt)),yt]).mean()-nll0); l1.append(np.abs(pi-ps).sum())
    harm=np.array(harm); f=(harm>0.05*nll0).mean(); se=np.sqrt(f*(1-f)/len(harm))
    print(f"m={m:3d} median dNLL {np.median(harm):.4f} p90 {np.quantile(harm,.9):.4f} P(dNLL>5%)={f:.3f}±{1.96*se:.3f} median L1 {np.median(l1):.3f}")
print("nll0",nll0)
