"""RoPE references: tables and rotations against transformers 5.23.0 (bit for bit in fp32),
hand-computed tables, an independent interleaved loop, inversion, pass-through, bad input."""
from __future__ import annotations

import math

import pytest
import torch

from hwinfer.ops.rope import apply_rope, rope_tables

DSV4_YARN = {"rope_type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
             "beta_fast": 32, "beta_slow": 1, "attention_factor": 1.0}
POSITIONS = torch.tensor([0, 1, 2, 7, 100, 4095, 65535, 999_999])


def _zeros(n: int = 1) -> torch.Tensor:
    return torch.zeros(1, n)  # transformers' rotary modules only read x's device and dtype


# ----------------------------------------------------------------------------------------------
# Tables


def test_default_table_by_hand():
    cos, sin = rope_tables(torch.tensor([0, 3, 1000]), rotary_dim=8, base=10000.0)
    assert cos.shape == sin.shape == (3, 4) and cos.dtype == torch.float32
    for t, p in enumerate([0, 3, 1000]):
        for i in range(4):
            angle = p * 10000.0 ** (-2 * i / 8)
            assert abs(cos[t, i].item() - math.cos(angle)) < 2e-4 * max(1, p / 1000)
            assert abs(sin[t, i].item() - math.sin(angle)) < 2e-4 * max(1, p / 1000)
    linear, _ = rope_tables(torch.tensor([8]), rotary_dim=8, base=10000.0,
                            scaling={"rope_type": "linear", "factor": 4.0})
    plain, _ = rope_tables(torch.tensor([2]), rotary_dim=8, base=10000.0)
    torch.testing.assert_close(linear, plain, atol=1e-6, rtol=0)


def test_tables_match_transformers_deepseek_v4():
    pytest.importorskip("transformers")
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

    cfg = DeepseekV4Config(head_dim=512, qk_rope_head_dim=64, rope_theta=10000,
                           compress_rope_theta=160000, max_position_embeddings=1048576,
                           rope_scaling={"type": "yarn", "factor": 16, "beta_fast": 32,
                                         "beta_slow": 1, "original_max_position_embeddings": 65536})
    # transformers injects attention_factor = 1 for V4's YaRN (no magnitude scaling)
    assert cfg.rope_parameters["compress"]["attention_factor"] == 1.0
    rotary = DeepseekV4RotaryEmbedding(cfg)
    for layer_type, base, scaling in [("main", 10000, None), ("compress", 160000, DSV4_YARN)]:
        want_cos, want_sin = rotary(_zeros(), POSITIONS[None], layer_type=layer_type)
        cos, sin = rope_tables(POSITIONS, rotary_dim=64, base=base, scaling=scaling)
        assert torch.equal(cos, want_cos[0]) and torch.equal(sin, want_sin[0]), layer_type
    # the compress dict as transformers stores it (legacy "type" key included) is accepted as is
    compress = {k: v for k, v in cfg.rope_parameters["compress"].items()
                if k not in ("rope_theta", "partial_rotary_factor")}
    assert torch.equal(rope_tables(POSITIONS, rotary_dim=64, base=160000, scaling=compress)[0],
                       rope_tables(POSITIONS, rotary_dim=64, base=160000, scaling=DSV4_YARN)[0])


def test_tables_match_transformers_gemma4_and_qwen35():
    pytest.importorskip("transformers")
    from transformers import Gemma4TextConfig, Qwen3_5TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    gcfg = Gemma4TextConfig(head_dim=256, global_head_dim=512, num_attention_heads=2,
                            hidden_size=64)
    assert gcfg.rope_parameters["full_attention"] == {
        "rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}
    rotary = Gemma4TextRotaryEmbedding(gcfg)
    cases = [("sliding_attention", 256, 1e4, None),
             ("full_attention", 512, 1e6, {"rope_type": "proportional", "partial_rotary_factor": 0.25})]
    for layer_type, dim, base, scaling in cases:
        want_cos, want_sin = rotary(_zeros(), POSITIONS[None], layer_type)
        cos, sin = rope_tables(POSITIONS, rotary_dim=dim, base=base, scaling=scaling)
        # transformers duplicates the table for rotate-half: [cos, cos] over the full head
        assert torch.equal(torch.cat((cos, cos), -1), want_cos[0]), layer_type
        assert torch.equal(torch.cat((sin, sin), -1), want_sin[0]), layer_type
    cos, sin = rope_tables(POSITIONS, rotary_dim=512, base=1e6, scaling=cases[1][3])
    assert (cos[:, 64:] == 1).all() and (sin[:, 64:] == 0).all() and (sin[1:, :64] != 0).all()

    qcfg = Qwen3_5TextConfig(head_dim=256, hidden_size=64, num_attention_heads=2,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                              "partial_rotary_factor": 0.25})
    want_cos, want_sin = Qwen3_5TextRotaryEmbedding(qcfg)(_zeros(), POSITIONS[None])
    cos, sin = rope_tables(POSITIONS, rotary_dim=64, base=1e7)
    assert torch.equal(torch.cat((cos, cos), -1), want_cos[0])
    assert torch.equal(torch.cat((sin, sin), -1), want_sin[0])


@pytest.mark.parametrize("scaling", [
    {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
    {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "mscale": 1.0,
     "mscale_all_dim": 0.707, "beta_fast": 16, "beta_slow": 2},
    {"rope_type": "yarn", "factor": 8, "original_max_position_embeddings": 8192, "truncate": False},
    {"rope_type": "linear", "factor": 4.0},
])
def test_tables_match_transformers_init_functions(scaling):
    """YaRN with a derived magnitude (0.1 ln(factor) + 1, or the mscale ratio) and linear."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, max_position_embeddings=163840,
                      rope_parameters={**scaling, "rope_theta": 50000.0})
    inv_freq, magnitude = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](cfg, "cpu")
    angles = POSITIONS[:, None].float() * inv_freq[None, :]
    cos, sin = rope_tables(POSITIONS, rotary_dim=64, base=50000.0, scaling=scaling)
    assert torch.equal(cos, angles.cos() * magnitude) and torch.equal(sin, angles.sin() * magnitude)
    if "attention_factor" not in scaling and "mscale" not in scaling and scaling["rope_type"] == "yarn":
        assert magnitude == pytest.approx(0.1 * math.log(scaling["factor"]) + 1)


# ----------------------------------------------------------------------------------------------
# Application


def _interleaved_loop(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int) -> torch.Tensor:
    out = x.double().clone()
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            for i in range(cos.shape[1]):
                a, b = x[t, h, start + 2 * i].item(), x[t, h, start + 2 * i + 1].item()
                c, s = cos[t, i].item(), sin[t, i].item()
                out[t, h, start + 2 * i] = a * c - b * s
                out[t, h, start + 2 * i + 1] = b * c + a * s
    return out


@pytest.mark.parametrize("start", [0, 8, 24])
def test_interleaved_matches_explicit_loop(start):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 40, generator=gen)
    cos, sin = rope_tables(torch.tensor([0, 1, 9, 77, 500]), rotary_dim=16, base=1e4)
    out = apply_rope(x, cos, sin, start=start, interleaved=True)
    torch.testing.assert_close(out.double(), _interleaved_loop(x, cos, sin, start), atol=1e-6, rtol=1e-6)


def test_rotations_match_transformers():
    pytest.importorskip("transformers")
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import apply_rotary_pos_emb as dsv4
    from transformers.models.gemma4.modeling_gemma4 import apply_rotary_pos_emb as gemma4
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import apply_rotary_pos_emb_interleave as glm
    from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb as qwen

    gen = torch.Generator().manual_seed(1)
    pos = torch.randint(0, 5000, (6,), generator=gen)
    cos, sin = rope_tables(pos, rotary_dim=64, base=160000.0, scaling=DSV4_YARN)
    bhsd = lambda x: x.transpose(0, 1)[None]  # noqa: E731  [T, H, D] -> [1, H, T, D]

    # DeepSeek-V4: interleaved on the last 64 of 512 channels, and the inverse on the output
    x = torch.randn(6, 3, 512, generator=gen)
    for inverse in (False, True):
        want = dsv4(bhsd(x), cos[None], (-sin if inverse else sin)[None])[0].transpose(0, 1)
        assert torch.equal(apply_rope(x, cos, sin, start=448, interleaved=True, inverse=inverse), want)

    # Qwen3.5: rotate-half on the first 64 of 256 channels
    x = torch.randn(6, 3, 256, generator=gen)
    cos2, sin2 = torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None]
    want, _ = qwen(bhsd(x), bhsd(x), cos2, sin2)
    assert torch.equal(apply_rope(x, cos, sin), want[0].transpose(0, 1))

    # Gemma 4 global layer: proportional table, rotate-half over the whole head
    x = torch.randn(6, 2, 512, generator=gen)
    gcos, gsin = rope_tables(pos, rotary_dim=512, base=1e6,
                             scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25})
    want = gemma4(bhsd(x), torch.cat((gcos, gcos), -1)[None], torch.cat((gsin, gsin), -1)[None])
    out = apply_rope(x, gcos, gsin)
    assert torch.equal(out, want[0].transpose(0, 1))
    assert torch.equal(out[..., 64:256], x[..., 64:256]) and torch.equal(out[..., 320:], x[..., 320:])

    # GLM-5 indexer: interleaved on the first 64 of 128; transformers emits the rotated pairs
    # de-interleaved (evens then odds), a fixed permutation of our in-place layout
    x = torch.randn(6, 4, 128, generator=gen)
    want, _ = glm(x[..., :64], x[..., :64], torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
    out = apply_rope(x, cos, sin, start=0, interleaved=True)
    perm = torch.cat((torch.arange(0, 64, 2), torch.arange(1, 64, 2)))
    assert torch.equal(out[..., :64][..., perm], want) and torch.equal(out[..., 64:], x[..., 64:])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inverse_undoes_and_passthrough_is_exact(interleaved, dtype):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(7, 4, 96, generator=gen).to(dtype)
    cos, sin = rope_tables(torch.randint(0, 1 << 20, (7,), generator=gen), rotary_dim=32,
                           base=1.6e5, scaling=DSV4_YARN)
    out = apply_rope(x, cos, sin, start=40, interleaved=interleaved)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out[..., :40], x[..., :40]) and torch.equal(out[..., 72:], x[..., 72:])
    back = apply_rope(out, cos, sin, start=40, interleaved=interleaved, inverse=True)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(back.float(), x.float(), atol=tol, rtol=tol)
    # the rotation preserves the norm of every pair
    torch.testing.assert_close(out.float().norm(dim=-1), x.float().norm(dim=-1), atol=tol, rtol=tol)


def test_single_head_and_edge_shapes():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 64, generator=gen)
    cos, sin = rope_tables(torch.arange(4), rotary_dim=32, base=1e4)
    for interleaved in (False, True):
        two_d = apply_rope(x, cos, sin, start=32, interleaved=interleaved)
        three_d = apply_rope(x[:, None], cos, sin, start=32, interleaved=interleaved)[:, 0]
        assert torch.equal(two_d, three_d)
    empty = rope_tables(torch.zeros(0, dtype=torch.int64), rotary_dim=32, base=1e4)
    assert empty[0].shape == (0, 16)
    assert apply_rope(torch.randn(0, 2, 64), *empty).shape == (0, 2, 64)
    # position 0 is the identity rotation
    c0, s0 = rope_tables(torch.zeros(1, dtype=torch.int32), rotary_dim=64, base=1e4)
    y = torch.randn(1, 3, 64, generator=gen)
    assert torch.equal(apply_rope(y, c0, s0, interleaved=True), y)


def test_bad_inputs_raise():
    pos = torch.arange(3)
    with pytest.raises(ValueError, match="positions must be a 1-D integer"):
        rope_tables(pos.float(), rotary_dim=8, base=1e4)
    with pytest.raises(ValueError, match="positive even"):
        rope_tables(pos, rotary_dim=7, base=1e4)
    with pytest.raises(ValueError, match="base must be"):
        rope_tables(pos, rotary_dim=8, base=0.0)
    with pytest.raises(ValueError, match="unknown scaling type"):
        rope_tables(pos, rotary_dim=8, base=1e4, scaling={"rope_type": "longrope"})
    with pytest.raises(ValueError, match="unexpected keys"):
        rope_tables(pos, rotary_dim=8, base=1e4, scaling={"rope_type": "linear", "factor": 2, "rope_theta": 1e4})
    with pytest.raises(ValueError, match="needs 'factor'"):
        rope_tables(pos, rotary_dim=8, base=1e4, scaling={"rope_type": "yarn"})
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        rope_tables(pos, rotary_dim=8, base=1e4, scaling={"rope_type": "yarn", "factor": 4})
    cos, sin = rope_tables(pos, rotary_dim=8, base=1e4)
    x = torch.randn(3, 2, 16)
    with pytest.raises(ValueError, match="x must be"):
        apply_rope(x[None], cos, sin)
    with pytest.raises(ValueError, match="cos and sin"):
        apply_rope(x, cos, sin[:, :2])
    with pytest.raises(ValueError, match="tables have 2 rows"):
        apply_rope(x, cos[:2], sin[:2])
    with pytest.raises(ValueError, match="does not fit"):
        apply_rope(x, cos, sin, start=9)
    with pytest.raises(ValueError, match="does not fit"):
        apply_rope(x, cos, sin, start=-1)
