"""The Triton MoE GEMMs' building blocks (hwinfer/kernels/triton/moe_tiles.py) under the
interpreter: the e4m3 / e2m1 decoders on every code against torch's own conversion, bit for
bit (subnormals and signed zeros included); every form of the K step (FP4 scales per 32-group or
per element, FP4 activations as one load split into pairs or two strided loads) giving the same
bits, with H and I off the K tile, and matching the reference expert FFN; the decode form
(moe_gemv.py) on dense, FP8 and FP4 experts against the reference and the tile form."""
from __future__ import annotations

from tests.kernels.interpreted import run_interpreted

SCRIPT = r"""
import itertools
import torch, triton, triton.language as tl
from hwinfer.kernels.triton import moe_gemm, moe_tiles
from hwinfer.ops import moe_experts as ref
from hwinfer.ops.quant import decode_e2m1
moe_gemm.DECODE_FORM = "tiles"      # the tile form's K steps first (decode sizes would take gemv)

@triton.jit
def decode(c_ptr, o8_ptr, o4_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    c = tl.load(c_ptr + i)
    tl.store(o8_ptr + i, moe_tiles._e4m3(c))
    tl.store(o4_ptr + i, moe_tiles._e2m1(c))

codes = torch.arange(256, dtype=torch.int32)
o8, o4 = torch.full((256,), float("nan")), torch.full((256,), float("nan"))
decode[(1,)](codes, o8, o4, N=256)
want8 = codes.to(torch.uint8).view(torch.float8_e4m3fn).float()
nan = want8.isnan()
assert torch.equal(o8[~nan].view(torch.int32), want8[~nan].view(torch.int32)), "e4m3 decode"
assert torch.equal(o8[nan], torch.tensor([480.0, -480.0])), o8[nan]
want4 = decode_e2m1((codes & 15).to(torch.uint8)).float()  # the high nibble is ignored
assert torch.equal(o4.view(torch.int32), want4.view(torch.int32)), "e2m1 decode"

g = torch.Generator().manual_seed(0)
T, H, I, E, K = 5, 96, 64, 4, 2     # H = 96: the K step of 128 runs past the row (masks)
x = torch.randn(T, H, generator=g)
ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(torch.int32)
ids[1, 1] = -1                       # a skipped slot
w = torch.rand(T, K, generator=g) + 0.1
def ue8m0(*shape):
    return torch.randint(120, 130, shape, generator=g, dtype=torch.int32).to(torch.uint8)
w13 = torch.randint(0, 256, (E, 2 * I, H // 2), generator=g, dtype=torch.int32).to(torch.uint8)
w2 = torch.randint(0, 256, (E, H, I // 2), generator=g, dtype=torch.int32).to(torch.uint8)
s13, s2 = ue8m0(E, 2 * I, H // 32), ue8m0(E, H, I // 32)
args = (x, w, ids, w13, s13, w2, s2)
want = ref.moe_experts_fp4(*args, activation="swiglu", limit=7.0)
outs = {}
for groups, pairs in itertools.product((True, False), repeat=2):
    moe_gemm.FP4_GROUPS, moe_gemm.A_PAIRS = groups, pairs
    outs[groups, pairs] = moe_gemm.moe_experts_fp4(*args, activation="swiglu", limit=7.0)
first = outs[True, True]
for form, out in outs.items():
    assert torch.equal(out, first), form
err = (first - want).abs().max().item()
assert err <= 1e-4 * want.abs().max().item(), err
moe_gemm.SWAP_AB = True             # the products transposed: the same sums in another order
for groups in (True, False):
    moe_gemm.FP4_GROUPS = groups
    out = moe_gemm.moe_experts_fp4(*args, activation="swiglu", limit=7.0)
    assert (out - first).abs().max().item() <= 1e-5 * want.abs().max().item(), groups
moe_gemm.SWAP_AB, moe_gemm.FP4_GROUPS = False, True
def e4m3(*shape):                    # every finite code, both signs
    b = torch.randint(0, 0x7f, shape, generator=g, dtype=torch.int32)
    return (b | (torch.randint(0, 2, shape, generator=g, dtype=torch.int32) << 7)).to(torch.uint8)
f8 = (x, w, ids, e4m3(E, 2 * I, H).view(torch.float8_e4m3fn), torch.full((E, 2, 1), 2.0 ** -8),
      e4m3(E, H, I).view(torch.float8_e4m3fn), torch.full((E, 1, 1), 2.0 ** -8))
want = ref.moe_experts_fp8(*f8, block=(128, 128), activation="swiglu")
for swap in (False, True):
    moe_gemm.SWAP_AB = swap
    got = moe_gemm.moe_experts_fp8(*f8, block=(128, 128), activation="swiglu")
    assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item(), swap
moe_gemm.SWAP_AB = None

# The decode form (moe_gemv.py) on every format, K blocks of 64 (H = 96: a tail block), 8 rows
# a program (I = 64 / H = 96 columns: several programs), FP8 scale blocks of 32 x 32 (two block
# rows for gate and for up), a skipped slot; against the reference and against the tile form.
moe_gemm.DECODE_FORM, moe_gemm.GEMV_TILE = "gemv", (8, 64, 4)
def both(fn, *args, **kw):
    out = {}
    for form in ("gemv", "tiles"):
        moe_gemm.DECODE_FORM = form
        out[form] = torch.full_like(args[0], float("nan")).copy_(fn(*args, **kw))
    moe_gemm.DECODE_FORM = "gemv"
    return out["gemv"], out["tiles"]
def close(got, want, what):
    err = (got - want).abs().max().item()
    assert err <= 1e-5 * want.abs().max().item(), (what, err)
def fp8_scales(*shape):              # UE8M0 2^-10 .. 2^-7: swiglu's inputs stay O(1)
    return torch.randint(117, 121, shape, generator=g, dtype=torch.int32).to(torch.uint8)
cases = {
    "dense": (moe_gemm.moe_experts, ref.moe_experts,
              (x, w, ids, torch.randn(E, 2 * I, H, generator=g) / 8, torch.randn(E, H, I, generator=g) / 8), {}),
    "fp8": (moe_gemm.moe_experts_fp8, ref.moe_experts_fp8,
            (x, w, ids, e4m3(E, 2 * I, H).view(torch.float8_e4m3fn), fp8_scales(E, 4, 3),
             e4m3(E, H, I).view(torch.float8_e4m3fn), fp8_scales(E, 3, 2)), {"block": (32, 32)}),
    "fp4": (moe_gemm.moe_experts_fp4, ref.moe_experts_fp4, args, {}),
}
for name, (fn, ref_fn, a, kw) in cases.items():
    gemv, tiles = both(fn, *a, activation="swiglu", limit=7.0, **kw)
    close(gemv, ref_fn(*a, activation="swiglu", limit=7.0, **kw), name)
    close(gemv, tiles, name + " vs tiles")
moe_gemm.DECODE_FORM = "tiles"
print("ok")
"""


def test_moe_decoders_and_step_forms_interpreted():
    run_interpreted(SCRIPT, timeout=300)
