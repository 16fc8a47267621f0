"""DeepSeek-V4 with its attention caches stored as packed ``fp8_ds_mla`` rows (``kv_format="fp8"``).

The model is the tiny DeepSeek-V4 at the released head widths (``size="tiny_d512"``: attention
512 with 64 RoPE channels, which the 584-byte rows need). The reference (:func:`reference`) is
the same checkpoint with model-dtype caches, quantizing where the packed model must: every KV
row is replaced by its ``fp8_ds_mla`` round trip where it is made, and every write to ``swa`` /
``comp`` stores the round trip of what is written (:class:`RoundTrip`, a tensor subclass that
intercepts writes and nothing else). It reaches that through the float-cache code path, so the
packed model must match it exactly: every packed row of every layer unpacks to the reference's
row after every step, which catches a write that forgets to pack (or packs something else) even
where the logits would barely move; a mutation test shows the check failing.

Both models use the torch ``kv_compress_step`` (the reference needs its Python-level store
write; the packed model the same arithmetic, so the rows agree exactly).
"""
from __future__ import annotations

import pytest
import torch

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.engine.pool import CacheBytes
from hwinfer.ops.kv_pack import FP8_DS_BYTES, pack_fp8_ds_mla, unpack_fp8_ds_mla
from hwinfer.runtime.batch import ForwardBatch
from hwinfer.testing.checkpoints import write_checkpoint
from tests.models import oracle

PACKED = ("swa", "comp")
# The reference's compressor step must write through RoundTrip's indexing (a kernel writing the
# store in place would bypass it): the torch impl. The models under test use the default choice.
REF_IMPL = {"kv_compress_step": "torch"}
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


class RoundTrip(torch.Tensor):
    """A float cache tensor whose writes (``t[index] = value``, also through ``flatten`` views)
    store ``unpack(pack(value))``. Every other op returns plain tensors, so reads and the
    attention ops see ordinary float rows."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            if func is torch.Tensor.__setitem__ and isinstance(args[2], torch.Tensor):
                target, index, value = args
                args = (target, index, unpack_fp8_ds_mla(pack_fp8_ds_mla(value)).to(target.dtype))
            out = func(*args, **kwargs)
        return out.as_subclass(cls) if func is torch.Tensor.flatten else out


def round_trip(cache) -> None:
    """Turn the float ``swa`` / ``comp`` tensors of a ModelCache into :class:`RoundTrip` views."""
    for layer in cache.layers:
        for name in PACKED:
            if layer is not None and name in layer:
                layer[name] = layer[name].as_subclass(RoundTrip)


def reference(path):
    """The model-dtype cache model that quantizes where the packed one does: the attention's KV
    rows (the only 2-D, 512-wide ``apply_rope`` output) round-tripped where they are made, so
    prefill attends its new rows as stored, and every cache write round-tripped
    (:func:`round_trip`, which the compressed entries need). ``model.rows_made`` counts the KV
    row sets it quantized."""
    model = load_model(path, device=oracle.DEVICE, dtype=oracle.DTYPE, impl=REF_IMPL)
    rope, model.rows_made = model.ops.apply_rope, 0

    def apply_rope(x, *args, **kwargs):
        out = rope(x, *args, **kwargs)
        if out.dim() == 2 and out.shape[-1] == 512:
            model.rows_made += 1
            out = unpack_fp8_ds_mla(pack_fp8_ds_mla(out)).to(out.dtype)
        return out
    model.ops.apply_rope = apply_rope
    return model


def assert_same_rows(packed_cache, ref_cache) -> None:
    """Every packed row (written or not) unpacks exactly to the reference's row."""
    for i, (ours, ref) in enumerate(zip(packed_cache.layers, ref_cache.layers)):
        for name in PACKED:
            if name in ours:
                got = ours[name]
                assert got.dtype == torch.uint8 and got.shape[:-1] == ref[name].shape[:-1]
                bad = (unpack_fp8_ds_mla(got) != ref[name].float()).any(dim=-1)
                assert not bad.any(), f"layer {i} {name}: {int(bad.sum())} rows differ from the reference"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(path, packed model, model-dtype model, reference)."""
    path = write_checkpoint("deepseek_v4", tmp_path_factory.mktemp("dsv4_d512"), size="tiny_d512")
    load = dict(device=oracle.DEVICE, dtype=oracle.DTYPE)
    return path, load_model(path, kv_format="fp8", **load), load_model(path, **load), reference(path)


def _steps(model, seqs, plan, cache, alloc):
    """Feed each request its tokens in the planned chunks (0 = idle); yields the logits per step."""
    n = len(seqs)
    table, slots = alloc.block_table(model.device), torch.arange(n, device=model.device)
    done = [0] * n
    for counts in plan:
        act = [i for i in range(n) if counts[i]]
        ids = torch.tensor([t for i in act for t in seqs[i][done[i]:done[i] + counts[i]]], device=model.device)
        batch = ForwardBatch.step(ids, [counts[i] for i in act], [done[i] for i in act], cache, slots[act],
                                  table[act])
        with torch.no_grad():
            yield model.logits(model.forward_batch(batch))
        for i in act:
            done[i] += counts[i]


def _schedule():
    """Three requests: prefill chunks, a mixed step (chunk continuations + a decode), then decodes."""
    ids = oracle.random_ids(512, 3, 30, seed=5)
    seqs = [ids[0, :27].tolist(), ids[1, :22].tolist(), ids[2].tolist()]
    plan = [[13, 17, 11], [9, 1, 12]]
    left = [len(s) - sum(p[i] for p in plan) for i, s in enumerate(seqs)]
    return seqs, plan + [[int(k < left[i]) for i in range(3)] for k in range(max(left))]


def _caches(model, ref: bool = False):
    cache, alloc = model.new_cache(3, 30)
    if ref:
        round_trip(cache)
    return cache, alloc


def test_option_validation(models, tmp_path):
    path, packed, plain, _ = models
    assert (packed.kv_format, plain.kv_format) == ("fp8", "auto")
    with pytest.raises(ValueError, match="kv_format"):
        load_model(path, device="cpu", kv_format="int4")
    with pytest.raises(ValueError, match="kv_format"):
        plain.set_kv_format("e4m3")
    # 64-wide heads (the plain tiny config) cannot hold fp8_ds_mla rows: refused by name.
    with pytest.raises(ValueError, match="deepseek_v4"):
        load_model(write_checkpoint("deepseek_v4", tmp_path / "d64"), device="cpu", kv_format="fp8")
    with pytest.raises(ValueError, match="qwen3_5"):
        load_model(write_checkpoint("qwen3_5", tmp_path / "qwen"), device="cpu", kv_format="fp8")
    from hwinfer.cli import main

    assert main(["generate", str(tmp_path / "qwen"), "hi", "--device", "cpu", "--kv-format", "fp8"]) == 2


def test_packed_caches_are_uint8_rows_of_584_bytes(models):
    _, packed, plain, _ = models
    cache, _ = packed.new_cache(2, 40)
    ref, _ = plain.new_cache(2, 40)
    kinds = [set(layer) for layer in cache.layers]
    assert {"swa", "comp", "idx"} <= kinds[1] and "comp" in kinds[2]
    for ours, theirs in zip(cache.layers, ref.layers):
        for name, t in ours.items():
            if name in PACKED:
                assert t.dtype == torch.uint8 and t.shape == (*theirs[name].shape[:-1], FP8_DS_BYTES)
                assert ours.specs[name].shape == (512,) and ours.specs[name].row_bytes == FP8_DS_BYTES
            else:  # indexer keys and compressor state keep their dtype
                assert t.dtype == theirs[name].dtype and t.shape == theirs[name].shape
    # The pool is planned from the same declarations: 584 instead of 4 x 512 bytes a row here
    # (fp32) for the entries of the CSA (m 4), HCA (m 8) and CSA layers.
    saved = CacheBytes.of(plain).per_token - CacheBytes.of(packed).per_token
    assert saved == pytest.approx((4 * 512 - FP8_DS_BYTES) * (1 / 4 + 1 / 8 + 1 / 4))


def test_first_layer_rows_are_the_packed_model_dtype_rows(models):
    """One prefill from empty: the sliding first layer reads no cache, so its ring must hold
    exactly pack_fp8_ds_mla of what the model-dtype cache holds."""
    _, packed, plain, _ = models
    seq = oracle.random_ids(512, 1, 20, seed=1)[0].tolist()
    rings = []
    for model in (packed, plain):
        cache, alloc = model.new_cache(1, 20)
        list(_steps(model, [seq], [[20]], cache, alloc))
        rings.append(cache.layers[0]["swa"])
    ours, rows = rings
    assert ours.dtype == torch.uint8 and ours.shape[-1] == FP8_DS_BYTES
    assert torch.equal(ours, pack_fp8_ds_mla(rows))
    assert rows.abs().sum() > 0 and not torch.equal(unpack_fp8_ds_mla(ours), rows.float())


def test_prefill_chunks_and_decode_match_the_reference(models):
    """Every step: every packed row of every layer unpacks to the reference's row, and the
    logits equal the reference's; the unquantized model's differ (the rows really are FP8)."""
    _, packed, plain, ref = models
    seqs, plan = _schedule()
    (cache, alloc), (ref_cache, ref_alloc), (exact_cache, exact_alloc) = \
        _caches(packed), _caches(ref, ref=True), _caches(plain)
    made = ref.rows_made
    worst = 0.0
    for got, want, exact in zip(_steps(packed, seqs, plan, cache, alloc), _steps(ref, seqs, plan, ref_cache, ref_alloc),
                                _steps(plain, seqs, plan, exact_cache, exact_alloc)):
        assert_same_rows(cache, ref_cache)
        assert oracle.rel_err(got, want) <= 1e-5
        worst = max(worst, oracle.rel_err(got, exact))
    assert worst > 1e-3 and ref.rows_made - made == len(plan) * len(packed.layers)


def test_a_write_that_packs_differently_is_caught(models, monkeypatch):
    """Mutation check of the row comparison: packing bf16-rounded rows (a plausible slip) stores
    other values in almost every row, and the comparison must see it. A write that forgets to
    pack altogether stores garbage bytes and is caught the same way."""
    import hwinfer.layers.deepseek_v4_attention as layer_module

    _, packed, _, ref = models
    real = layer_module._to_store
    monkeypatch.setattr(layer_module, "_to_store",
                        lambda rows, store: real(rows.to(torch.bfloat16), store) if store.dtype == torch.uint8
                        else real(rows, store))
    seqs, plan = _schedule()
    (cache, alloc), (ref_cache, ref_alloc) = _caches(packed), _caches(ref, ref=True)
    next(_steps(packed, seqs, plan, cache, alloc))
    next(_steps(ref, seqs, plan, ref_cache, ref_alloc))
    with pytest.raises(AssertionError, match="rows differ"):
        assert_same_rows(cache, ref_cache)


def _prompts():
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(3, 512, (k,), generator=gen).tolist() for k in (5, 23, 9, 30)]


def _generate(model, prompts, ref: bool = False, **kw) -> tuple[Engine, list[list[int]]]:
    kw = {"max_num_seqs": 4, "max_num_batched_tokens": 32, "num_blocks": 64, **kw}
    engine = Engine(model, **kw)
    if ref:
        round_trip(engine.pool.cache)
    reqs = [engine.add_request(p, GREEDY) for p in prompts[:2]]
    engine.step()
    reqs += [engine.add_request(p, GREEDY) for p in prompts[2:]]
    out = [o.token_ids for o in engine.run(reqs)]
    assert engine.pool.is_empty() or engine.prefix is not None
    return engine, out


def test_greedy_generation_matches_the_reference_and_fixed_size_decode(models):
    """The engine (chunked prefill, batched decode): packed tokens = reference tokens; the
    fixed-size decode path CUDA graphs replay (run eagerly on the CPU) gives the same tokens."""
    _, packed, _, ref = models
    prompts = _prompts()
    _, want = _generate(ref, prompts, ref=True, cuda_graphs=False)
    _, got = _generate(packed, prompts, cuda_graphs=False)
    assert got == want
    engine, graphed = _generate(packed, prompts, cuda_graphs=True)
    assert graphed == want and engine.graphs.replays > 0 and engine.graphs.disabled is None


def test_speculative_decoding_and_prefix_caching_keep_outputs(models):
    """Spare ring rows (speculation) and slot copies / shared blocks (prefix caching) over
    packed rows: the same tokens as plain packed decoding. Greedy only: a verify step computes
    a token's KV with other matmul shapes than a decode step (~1e-7 apart), and the FP8 rounding
    can turn that into a one-step e4m3 difference in a value, enough to flip a seeded sample
    now and then (tests/engine/test_speculative.py's sampled case, run with this format, does)."""
    _, packed, _, _ = models
    prompts = _prompts()
    _, want = _generate(packed, prompts)
    engine, got = _generate(packed, prompts, num_speculative_tokens=2)
    assert got == want and engine.spec_stats().verify_steps > 0
    assert engine.pool.cache.layers[-1]["swa"].dtype == torch.uint8  # the MTP layer's ring too
    prefixed = [prompts[3][:20] + p for p in prompts[:3]]
    _, want = _generate(packed, prefixed)
    engine, got = _generate(packed, prefixed, enable_prefix_caching=True, prefix_chunk_tokens=16,
                            prefix_checkpoints=8)
    assert got == want and engine.prefix.stats.hit_tokens > 0
