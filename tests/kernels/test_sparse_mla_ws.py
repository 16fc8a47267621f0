"""The warp-specialised Gluon sparse MLA decode (hwinfer/kernels/triton/sparse_mla_ws.py) on a
Hopper card, against the reference op and the Triton split kernel: DeepSeek-V4 shapes (64 heads,
512 channels, sinks, inverse RoPE) with a ring list and an extra list, -1 entries, chunks cut
by list ends, a token with no valid row, 1 to many splits, int64 indices, fp16, and freed memory
poisoned with NaN first (the allocator hands it to the partials); the same for the packed FP8
form (sparse_mla_ws_fp8.py). Skipped without an sm_90 GPU:
Gluon kernels do not run under the Triton interpreter (CI compiles this one ahead of time)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.version.hip
    or torch.cuda.get_device_capability() != (9, 0), reason="needs an NVIDIA sm_90 GPU")


def _inputs(batch, k1, k2, dtype, index_dtype, gen, d=512):
    dev = "cuda"
    ring = torch.randn(batch * 2, 64, d, generator=gen).to(dev, dtype)
    store = torch.randn(40, 64, d, generator=gen).to(dev, dtype) * 2
    idx = torch.randint(0, ring.shape[0] * 64, (batch, 1, k1), generator=gen)
    idx[torch.rand(idx.shape, generator=gen) < 0.1] = -1
    idx2 = torch.randint(0, store.shape[0] * 64, (batch, 1, k2), generator=gen)
    idx2[torch.rand(idx2.shape, generator=gen) < 0.1] = -1
    idx[0] = -1   # token 0: no valid ring row ...
    idx2[0] = -1  # ... nor entry: its output is the sink's share, 0
    cos = torch.rand(batch, 1, 32, generator=gen).to(dev)
    return dict(q=torch.randn(batch, 1, 64, d, generator=gen).to(dev, dtype), kv_cache=ring,
                indices=idx.to(dev, index_dtype), extra_kv_cache=store,
                extra_indices=idx2.to(dev, index_dtype), sinks=torch.randn(64, generator=gen).to(dev),
                scale=512 ** -0.5, out_rope=(cos.cos(), cos.sin()))


def _poison():
    """Fill most of the caching allocator's free memory with NaN, then free it again."""
    junk = torch.full((64 << 20,), float("nan"), device="cuda")
    del junk


def _check_against_reference_and_split(kw, splits):
    """The Gluon kernel (forced) on freed memory poisoned first, against the reference op and
    the Triton split kernel on the same inputs."""
    from hwinfer.kernels.triton.sparse_mla import sparse_mla_decode
    from hwinfer.ops.sparse_mla import sparse_mla_decode as reference

    _poison()
    out = sparse_mla_decode(**kw, ws=True, num_splits=splits)
    torch.cuda.synchronize()
    want = reference(**kw)
    split = sparse_mla_decode(**kw, ws=False, num_splits=splits)
    assert not out.isnan().any()
    scale = want.float().abs().max().item()
    err = (out.float() - want.float()).abs().max().item() / scale
    err_split = (split.float() - want.float()).abs().max().item() / scale
    # both kernels round P to 16 bits for the PV product; the Gluon one must be as close
    assert err < max(2 * err_split, 1e-2), (err, err_split)
    assert out[0].abs().max().item() == 0.0   # no valid row: the sink takes everything


def _case(batch, k1, k2, dtype, index_dtype, seed, packed=False):
    from hwinfer.ops.kv_pack import pack_fp8_ds_mla

    kw = _inputs(batch, k1, max(k2, 1), dtype, index_dtype, torch.Generator().manual_seed(seed))
    if packed:
        kw["kv_cache"] = pack_fp8_ds_mla(kw["kv_cache"])
        kw["extra_kv_cache"] = pack_fp8_ds_mla(kw["extra_kv_cache"])
    if k2 == 0:
        kw.pop("extra_kv_cache"), kw.pop("extra_indices")
    return kw


# the default (4 producer warps, QK split) and the forms the bench times against it (module
# constants, set for the call)
VARIANTS = {"default": {}, "pw1_qk_twice": dict(PRODUCER_WARPS=1, QK_SPLIT=False),
            "pw1_qk_split": dict(PRODUCER_WARPS=1),
            "idx_in_loop": dict(PREFETCH_IDX=False, PRODUCER_WARPS=1, QK_SPLIT=False),
            "overlap": dict(OVERLAP=True),
            "k32": dict(BLOCK_K=32, STAGES=4, CONSUMER_REGS=216, PRODUCER_REGS=64)}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("batch,k1,k2,splits,dtype,index_dtype", [
    (3, 128, 300, None, torch.bfloat16, torch.int32),
    (3, 128, 300, 1, torch.bfloat16, torch.int32),
    (2, 128, 1000, 7, torch.bfloat16, torch.int64),
    (5, 37, 0, None, torch.float16, torch.int32),
    (4, 64, 8192, None, torch.bfloat16, torch.int32),
])
def test_ws_decode_matches_reference(batch, k1, k2, splits, dtype, index_dtype, variant,
                                     monkeypatch):
    from hwinfer.kernels.triton import sparse_mla_ws

    kw = _case(batch, k1, k2, dtype, index_dtype, batch * 1000 + k2)
    assert sparse_mla_ws.ws_supported(kw["q"], kw["kv_cache"], None,
                                      kw.get("extra_kv_cache")) is None
    for name, value in VARIANTS[variant].items():
        monkeypatch.setattr(sparse_mla_ws, name, value)
    _check_against_reference_and_split(kw, splits)


# two 32-row raw slots a consumer step (3 or 2 slots), the next step's first slot decoded ahead
# (DECODE_AHEAD 1; 0: none; at 232 / 40 registers)
FP8_VARIANTS = {"default": {}, "s2": dict(STAGES=2), "pw1": dict(PRODUCER_WARPS=1),
                "ahead0": dict(DECODE_AHEAD=0),
                "ahead1_r232": dict(DECODE_AHEAD=1, CONSUMER_REGS=232, PRODUCER_REGS=40)}


@pytest.mark.parametrize("variant", list(FP8_VARIANTS))
@pytest.mark.parametrize("batch,k1,k2,splits,index_dtype", [
    (3, 128, 300, None, torch.int32),
    # 7 chunks of 32: a step whose halves are the main list's last (4 rows) and the extra
    # list's first, and a last step with one half of padding
    (3, 100, 77, 1, torch.int32),
    (2, 128, 1000, 7, torch.int64),
    (5, 37, 0, 1, torch.int32),
    (4, 64, 8192, None, torch.int32),
])
def test_ws_fp8_decode_matches_reference(batch, k1, k2, splits, index_dtype, variant,
                                         monkeypatch):
    """The packed-cache form (sparse_mla_ws_fp8.py): fp8_ds_mla rows, against the reference op
    (which unpacks them exactly) and the Triton split kernel on the same packed rows."""
    from hwinfer.kernels.triton import sparse_mla_ws_fp8

    kw = _case(batch, k1, k2, torch.bfloat16, index_dtype, batch * 1000 + k2 + 1, packed=True)
    assert sparse_mla_ws_fp8.ws_fp8_supported(kw["q"], kw["kv_cache"], None,
                                              kw.get("extra_kv_cache")) is None
    for name, value in FP8_VARIANTS[variant].items():
        monkeypatch.setattr(sparse_mla_ws_fp8, name, value)
    _check_against_reference_and_split(kw, splits)


# GLM-5's 576-wide rows (64 RoPE channels after the latent, values the first 512; no inverse
# RoPE): the default form (32-row slots, QK split) and the 64-row one (QK twice), ROPE_TUNING
GLM5_VARIANTS = {"default": {},
                 "k64_qk_twice": dict(BLOCK_K=64, STAGES=2, QK_SPLIT=False, CONSUMER_REGS=232,
                                      PRODUCER_REGS=40)}


@pytest.mark.parametrize("variant", list(GLM5_VARIANTS))
@pytest.mark.parametrize("batch,k1,k2,splits,sinks", [
    (3, 2048, 0, None, False),
    (2, 300, 77, 3, True),
    (5, 37, 0, 1, False),
    (4, 64, 2000, None, True),
])
def test_ws_glm5_rows_match_reference(batch, k1, k2, splits, sinks, variant, monkeypatch):
    from hwinfer.kernels.triton import sparse_mla_ws

    kw = _inputs(batch, k1, max(k2, 1), torch.bfloat16, torch.int32,
                 torch.Generator().manual_seed(batch * 100 + k1), d=576)
    kw.update(v_dim=512, out_rope=None, scale=256 ** -0.5)
    if not sinks:
        kw["sinks"] = None
    if k2 == 0:
        kw.pop("extra_kv_cache"), kw.pop("extra_indices")
    assert sparse_mla_ws.ws_supported(kw["q"], kw["kv_cache"], 512,
                                      kw.get("extra_kv_cache")) is None
    monkeypatch.setattr(sparse_mla_ws, "ROPE_TUNING",
                        {**sparse_mla_ws.ROPE_TUNING, **GLM5_VARIANTS[variant]})
    _check_against_reference_and_split(kw, splits)
