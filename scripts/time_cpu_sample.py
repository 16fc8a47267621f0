"""The CPU sampler against the reference, one 248,320-token row, single thread:

    OMP_NUM_THREADS=1 python3 scripts/time_cpu_sample.py

Prints a markdown row per sampling setting (best of 2 x 5 alternating runs, ms) after asserting
that both give the same token (docs/cpu-backend.md)."""
import torch, time
from hwinfer.kernels.torch import sampling as ts
from hwinfer.ops.sampling import sample as ref
torch.manual_seed(0)
V = 248320
l = torch.randn(1, V) * 3
def args(temp, k, p):
    return (l, torch.tensor([temp]), torch.tensor([k]), torch.tensor([p]), torch.tensor([7]), torch.tensor([3]))
def best(f, a, n=5):
    f(*a); ts_ = []
    for _ in range(n):
        t0 = time.perf_counter(); f(*a); ts_.append(time.perf_counter() - t0)
    return min(ts_) * 1e3
for label, temp, k, p in (("greedy", 0.0, 0, 1.0), ("temperature 0.8", 0.8, 0, 1.0), ("top-k 50", 0.8, 50, 1.0),
                          ("top-p 0.9", 0.8, 0, 0.9), ("top-k 50 + top-p 0.9", 0.8, 50, 0.9),
                          ("top-p 0.99, temperature 3 (flat)", 3.0, 0, 0.99)):
    a = args(temp, k, p)
    r1, t1, r2, t2 = best(ref, a), best(ts.sample, a), best(ref, a), best(ts.sample, a)
    assert torch.equal(ref(*a), ts.sample(*a))
    print(f"| {label} | {min(r1, r2):.1f} ms | {min(t1, t2):.1f} ms |")
