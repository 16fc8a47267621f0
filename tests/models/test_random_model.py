"""``random_model``: a model at a config's dimensions with random weights (the benchmarks' way
to run real sizes without weights). Packed FP4 experts (Kimi-K3's MXFP4 release) get random
e2m1 codes and scale exponents that keep activations O(1), drawn without an fp32 tensor of
the packed shape (Kimi-K3's real one is 37 GiB)."""
from __future__ import annotations

import math

import torch

from hwinfer.api import random_model
from hwinfer.testing.checkpoints import _slices, write_checkpoint


def test_packed_fp4_experts_are_random_codes_with_unit_scale(tmp_path):
    path = write_checkpoint("kimi_k3", tmp_path, quant="mxfp4")
    model = random_model(path, device="cpu", dtype="float32")
    packed = {n: p for n, p in model.named_parameters() if p.dtype == torch.uint8}
    assert packed, "the mxfp4 config should keep the experts packed"
    for name, p in packed.items():
        if name.endswith("_scale"):
            want = round(127 - math.log2(2.9) - 0.5 * math.log2(p.shape[-1] * 32))
            assert torch.all(p == want), name
        else:   # uniform bytes: every code pair appears, the mean near 127.5
            assert p.unique().numel() > 200 and abs(p.float().mean().item() - 127.5) < 8, name
    ids = torch.randint(3, model.config["vocab_size"], (12,))
    logits = model(ids)
    assert torch.isfinite(logits).all()
    # The experts matter: zero codes (e2m1 0) change the logits.
    for name, p in packed.items():
        if not name.endswith("_scale"):
            p.zero_()
    assert not torch.allclose(model(ids), logits)


def test_large_tensors_are_drawn_in_slices():
    small, big = torch.empty(4, 8), torch.empty(3, 1 << 25)
    assert len(_slices(small)) == 1 and _slices(small)[0] is small
    parts = _slices(big)
    assert len(parts) == 3 and all(part.data_ptr() == big[i].data_ptr() for i, part in enumerate(parts))
