"""Kimi-K3 (not in transformers): loading, generation, cached decode, MXFP4, and block-level
checks against references assembled from transformers 5.23.0 pieces.

The references read the *checkpoint tensors* (published names), not hwinfer's parameters:

* KDA block: ``Glm5NextTextLinearAttention`` (KDA with the lower-bounded forget gate) with its
  low-rank output gate replaced by K3's full-rank ``g_proj`` (g_a_proj -> Identity, g_b_proj ->
  a Linear holding g_proj), convs concatenated q, k, v, A_log's first h entries;
* MLA block: ``KimiLinearAttention`` with ``q_lora_rank`` set (q_a_proj / q_a_layernorm /
  q_b_proj), o_proj taken out to apply K3's sigmoid gate ``g_proj`` in between;
* latent MoE: ``NemotronHMoE`` (router on the full hidden state, fc1_latent_proj, experts in the
  latent space, fc2_latent_proj, shared expert on the full hidden state) with K3's gated SiTU
  experts (``DeepseekV4Experts`` with its ``_apply_gate`` set to SiTU-GLU), routed_expert_norm
  in front of fc2_latent_proj and a SiTU shared-expert MLP (``KimiLinearMLP`` with SiTU);
* the whole model: those blocks stacked with the attention-residual schedule transcribed here
  from the public descriptions of Moonshot's ``_apply_attn_res`` / ``_forward_attn_residual``.

SiTU-GLU and the attention-residual math are not in transformers: they are transcribed here
(independently of hwinfer's code) from the public K3 ports.
"""
from __future__ import annotations

import inspect
import json
import shutil
import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from hwinfer import load_model
from hwinfer.runtime.batch import ForwardBatch
from hwinfer.testing.checkpoints import write_checkpoint
from tests.models import oracle

tf = pytest.importorskip("transformers")
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Experts  # noqa: E402
from transformers.models.glm5_next import modeling_glm5_next as glm5  # noqa: E402
from transformers.models.kimi_linear import modeling_kimi_linear as kimi  # noqa: E402
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMoE  # noqa: E402

PUB = "language_model.model."
T = 70  # crosses the 64-token KDA chunk and several 16-token cache blocks


def situ(gate, up, beta, linear_beta):
    g, u = gate.float(), up.float()
    return beta * torch.tanh(g / beta) * torch.sigmoid(g) * (linear_beta * torch.tanh(u / linear_beta))


def apply_attn_res(prefix, blocks, proj_w, norm_w, eps):
    """Moonshot's ``_apply_attn_res`` as publicly transcribed: softmax over the RMS-normalised
    candidates scored by norm.weight * proj.weight, mixing the raw candidates."""
    v = torch.cat([blocks, prefix.unsqueeze(1)], dim=1).float()
    k = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    probs = (k * (norm_w.float() * proj_w.float().squeeze(0))).sum(-1).softmax(-1)
    return torch.matmul(probs.unsqueeze(1), v).squeeze(1).to(prefix.dtype)


def torch_paths(module) -> None:
    for name in ("causal_conv1d_fn", "causal_conv1d_update", "chunk_kimi_delta_attention",
                 "recurrent_kimi_delta_attention"):
        if hasattr(module, name):
            setattr(module, name, inspect.unwrap(getattr(module, name)))


def _token_loop(module, fn):
    """Run ``fn`` with the module's chunked KDA replaced by its own token loop (the definition):
    transformers' torch chunked form rounds ~3x worse than hwinfer's (measured against fp64),
    and the KDA output norm amplifies that on heads whose output is small."""
    chunked = module.chunk_kimi_delta_attention

    def loop(q, k, v, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
             use_qk_l2norm_in_kernel=False, **_):
        return module.recurrent_kimi_delta_attention(q, k, v, g, beta, initial_state, output_final_state,
                                                     use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    module.chunk_kimi_delta_attention = loop
    try:
        return fn()
    finally:
        module.chunk_kimi_delta_attention = chunked


class SituExperts(DeepseekV4Experts):
    def _apply_gate(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return situ(gate, up, self.beta, self.linear_beta)


class SituMLP(kimi.KimiLinearMLP):
    def forward(self, x):
        return self.down_proj(situ(self.gate_proj(x), self.up_proj(x), self.beta, self.linear_beta))


class Reference:
    """K3 assembled from transformers blocks, weights read from the published checkpoint."""

    def __init__(self, path):
        cfg = json.loads((path / "config.json").read_text())["text_config"]
        self.cfg, self.sd = cfg, load_file(str(path / "model.safetensors"))
        self.eps, self.block = cfg["rms_norm_eps"], cfg["attn_res_block_size"]
        lin = cfg["linear_attn_config"]
        self.types = ["linear_attention" if i + 1 in lin["kda_layers"] else "full_attention"
                      for i in range(cfg["num_hidden_layers"])]
        self.act = (cfg["activation_situ_beta"], cfg["activation_situ_linear_beta"])
        torch_paths(glm5)
        torch_paths(kimi)

    def w(self, key):
        return self.sd[PUB + key]

    def load(self, module, prefix, names):
        with torch.no_grad():
            for ours, theirs in names.items():
                module.get_parameter(ours).copy_(self.w(prefix + theirs).reshape(module.get_parameter(ours).shape))
        return module.eval()

    def kda(self, i):
        c, lin = self.cfg, self.cfg["linear_attn_config"]
        hf_cfg = glm5.Glm5NextTextConfig(hidden_size=c["hidden_size"], linear_attn_config=lin, hidden_act="silu",
                                         rms_norm_eps=self.eps, num_hidden_layers=c["num_hidden_layers"])
        m = glm5.Glm5NextTextLinearAttention(hf_cfg, i)
        p, h = f"layers.{i}.self_attn.", lin["num_heads"]
        m.g_a_proj, m.g_b_proj = nn.Identity(), nn.Linear(c["hidden_size"], h * lin["head_dim"], bias=False)
        names = {n: n for n in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "b_proj.weight",
                                "o_proj.weight", "o_norm.weight")}
        names.update({"forget_gate.f_a_proj.weight": "f_a_proj.weight", "forget_gate.dt_bias": "dt_bias",
                      "forget_gate.f_b_proj.weight": "f_b_proj.weight", "g_b_proj.weight": "g_proj.weight"})
        self.load(m, p, names)
        with torch.no_grad():
            m.conv1d.weight.copy_(torch.cat([self.w(p + f"{x}_conv1d.weight") for x in "qkv"]))
            m.forget_gate.A_log.copy_(self.w(p + "A_log")[:h])
        return lambda x: _token_loop(glm5, lambda: m(x[None])[0])

    def mla(self, i):
        c = {k: v for k, v in self.cfg.items() if k not in ("linear_attn_config", "model_type")}
        hf_cfg = kimi.KimiLinearConfig(**c)
        hf_cfg._attn_implementation = "eager"
        m = kimi.KimiLinearAttention(hf_cfg, i)
        p = f"layers.{i}.self_attn."
        self.load(m, p, {n: n for n, _ in m.named_parameters()})
        o_proj, m.o_proj = m.o_proj, nn.Identity()
        g_w = self.w(p + "g_proj.weight")

        def run(x):
            t = x.shape[0]
            mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
            out, _ = m(x[None], mask)
            return o_proj(out[0] * torch.sigmoid(x @ g_w.T))
        return run

    def mlp(self, i):
        c, h = self.cfg, self.cfg["hidden_size"]
        if i < c["first_k_dense_replace"]:
            m = SituMLP(SimpleNamespace(hidden_size=h, intermediate_size=c["intermediate_size"], hidden_act="silu"))
            m.beta, m.linear_beta = self.act
            return self.load(m, f"layers.{i}.mlp.", {n: n for n, _ in m.named_parameters()})
        lat, inter, e = c["routed_expert_hidden_size"], c["moe_intermediate_size"], c["num_experts"]
        shared = inter * c["num_shared_experts"]
        hf_cfg = tf.NemotronHConfig(
            hidden_size=h, n_routed_experts=e, num_experts_per_tok=c["num_experts_per_token"],
            moe_intermediate_size=inter, moe_latent_size=lat, moe_shared_expert_intermediate_size=shared,
            routed_scaling_factor=c["routed_scaling_factor"], n_group=c["num_expert_group"],
            topk_group=c["topk_group"], norm_topk_prob=c["moe_renormalize"])
        m = NemotronHMoE(hf_cfg)
        m.experts = SituExperts(SimpleNamespace(num_local_experts=e, hidden_size=lat, intermediate_size=inter,
                                                hidden_act="silu", swiglu_limit=None,
                                                _experts_implementation="eager"))
        m.experts.beta, m.experts.linear_beta = self.act
        m.shared_experts = SituMLP(SimpleNamespace(hidden_size=h, intermediate_size=shared, hidden_act="silu"))
        m.shared_experts.beta, m.shared_experts.linear_beta = self.act
        m.fc2_latent_proj = nn.Sequential(kimi.KimiLinearRMSNorm(lat, self.eps), nn.Linear(lat, h, bias=False))
        p = f"layers.{i}.block_sparse_moe."
        self.load(m, p, {"gate.weight": "gate.weight", "fc1_latent_proj.weight": "routed_expert_down_proj.weight",
                         "fc2_latent_proj.0.weight": "routed_expert_norm.weight",
                         "fc2_latent_proj.1.weight": "routed_expert_up_proj.weight",
                         **{f"shared_experts.{n}": f"shared_experts.{n}" for n in
                            ("gate_proj.weight", "up_proj.weight", "down_proj.weight")}})
        with torch.no_grad():
            m.gate.e_score_correction_bias.copy_(self.w(p + "gate.e_score_correction_bias"))
            ex = [f"{p}experts.{j}." for j in range(e)]
            m.experts.gate_up_proj.copy_(torch.stack([torch.cat([self.w(x + "w1.weight"), self.w(x + "w3.weight")])
                                                      for x in ex]))
            m.experts.down_proj.copy_(torch.stack([self.w(x + "w2.weight") for x in ex]))
        return m.eval()

    def norm(self, key):
        n = kimi.KimiLinearRMSNorm(self.cfg["hidden_size"], self.eps)
        return self.load(n, "", {"weight": key})

    @torch.no_grad()
    def logits(self, ids):
        """ids [T] -> [T, V]: embed, 5 layers with attention residuals, exit mix, norm, head."""
        h = self.w("embed_tokens.weight")[ids]
        blocks = h.new_zeros(h.shape[0], 0, h.shape[1])
        for i, kind in enumerate(self.types):
            res = lambda x, site: apply_attn_res(x, blocks, self.w(f"layers.{i}.{site}_res_proj.weight"),
                                                 self.w(f"layers.{i}.{site}_res_norm.weight"), self.eps)
            prefix = h
            x = res(prefix, "self_attention") if blocks.shape[1] else prefix
            if i % self.block == 0:
                blocks, prefix = torch.cat([blocks, prefix.unsqueeze(1)], dim=1), None
            mixer = self.kda(i) if kind == "linear_attention" else self.mla(i)
            a = mixer(self.norm(f"layers.{i}.input_layernorm.weight")(x))
            prefix = a if prefix is None else prefix + a
            m = self.mlp(i)(self.norm(f"layers.{i}.post_attention_layernorm.weight")(res(prefix, "mlp")))
            h = prefix + m
        h = apply_attn_res(h, blocks, self.w("output_attn_res_proj.weight"), self.w("output_attn_res_norm.weight"),
                           self.eps)
        return self.norm("norm.weight")(h) @ self.sd["language_model.lm_head.weight"].T


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    path = write_checkpoint("kimi_k3", tmp_path_factory.mktemp("kimi_k3"))
    return path, load_model(path, device=oracle.DEVICE, dtype=oracle.DTYPE), Reference(path)


def _x(hidden: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(T, hidden, generator=torch.Generator().manual_seed(seed))


def test_published_layout_loads_and_generates(k3):
    _, ours, _ = k3
    assert ours.layout_name == "published"
    assert sorted(ours.load_report.ignored) == ["mm_projector.pre_norm.weight",
                                                "vision_tower.encoder.blocks.0.norm0.weight"]
    out = ours.generate("The quick brown fox", max_new_tokens=6, temperature=0)
    assert len(out.token_ids) >= 1 and isinstance(out.text, str)
    batch = ours.generate([[5, 6, 7], list(range(10, 90))], max_new_tokens=4, temperature=0.8, seed=1)
    assert [len(o.token_ids) for o in batch] == [4, 4]


@pytest.mark.parametrize("layer", [1, 2])
def test_mixer_block_matches_transformers_reference(k3, layer):
    """Layer 1: KDA (lower-bounded gate, full-rank output gate); layer 2: gated MLA, q_lora."""
    _, ours, ref = k3
    x = _x(ours.args.hidden, layer)
    want = ref.kda(layer)(x) if layer == 1 else ref.mla(layer)(x)
    batch = ForwardBatch.full(torch.zeros(T, dtype=torch.long, device=ours.device), [T])
    got = ours.layers[layer].self_attn(x.to(ours.device), batch, None)
    assert oracle.rel_err(got, want) <= 1e-5


@pytest.mark.parametrize("layer", [0, 1])
def test_mlp_block_matches_transformers_reference(k3, layer):
    """Layer 0: dense SiTU MLP; layer 1: latent MoE (sigmoid+bias routing, SiTU experts, 2 shared)."""
    _, ours, ref = k3
    x = _x(ours.args.hidden, 10 + layer)
    with torch.no_grad():
        want = ref.mlp(layer)(x)
    assert oracle.rel_err(ours.layers[layer].mlp(x.to(ours.device)), want) <= 1e-5


def test_whole_model_matches_assembled_reference(k3):
    _, ours, ref = k3
    ids = oracle.random_ids(ours.config["vocab_size"], 1, T)[0]
    assert oracle.rel_err(ours(ids), ref.logits(ids)) <= oracle.LOGIT_RTOL


def test_cached_decode_equals_full_recompute(k3):
    _, ours, _ = k3
    ids = oracle.random_ids(ours.config["vocab_size"], 3, 70, seed=3)
    oracle.check_cached_equals_full(ours, [ids[0, :5].tolist(), ids[1, :70].tolist(), ids[2, :33].tolist()])


def test_text_only_layout_loads_with_the_same_logits(k3, tmp_path):
    path, ours, _ = k3
    sd = load_file(str(path / "model.safetensors"))
    save_file({k.removeprefix("language_model."): v for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    shutil.copy(path / "config.json", tmp_path / "config.json")
    again = load_model(tmp_path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    ids = oracle.random_ids(ours.config["vocab_size"], 1, 20)
    assert again.layout_name == "text-only" and torch.equal(again(ids), ours(ids))


def _dequant_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Independent e2m1 decode: low nibble = even column, 2^(byte-127) per 32 inputs."""
    lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).flatten(-2).long()
    return lut[codes] * torch.exp2(scale.float() - 127).repeat_interleave(32, dim=-1)


def test_mxfp4_checkpoint_equals_dequantized_checkpoint(tmp_path):
    q_dir, d_dir = tmp_path / "mxfp4", tmp_path / "dequant"
    write_checkpoint("kimi_k3", q_dir, quant="mxfp4")
    packed = load_model(q_dir, device=oracle.DEVICE, dtype=oracle.DTYPE)
    experts = packed.layers[1].mlp.experts  # kept MXFP4: run by latent_moe's FP4 path
    assert packed.load_report.dequantized == 0 and experts.w13.dtype == experts.w13_scale.dtype == torch.uint8
    sd, plain = load_file(str(q_dir / "model.safetensors")), {}
    for k, v in sd.items():
        if k.endswith(".weight_packed"):
            assert v.dtype == torch.uint8 and ".block_sparse_moe.experts." in k
            stem = k.removesuffix("_packed")
            plain[stem] = _dequant_mxfp4(v, sd[stem + "_scale"])
        elif not k.endswith(".weight_scale"):
            plain[k] = v
    d_dir.mkdir()
    save_file(plain, str(d_dir / "model.safetensors"))
    cfg = json.loads((q_dir / "config.json").read_text())
    cfg.pop("quantization_config")
    (d_dir / "config.json").write_text(json.dumps(cfg))
    dense = load_model(d_dir, device=oracle.DEVICE, dtype=oracle.DTYPE)
    ids = oracle.random_ids(packed.config["vocab_size"], 2, 40)
    # Exact on the CPU (both run the torch impls in fp32). On a GPU the packed experts run the
    # Triton FP4 GEMM, which takes fp32 activations as bf16 hi + lo parts (~16 mantissa bits):
    # the H200 measured 3.3e-6 (2026-12-05), so the bound there is 2e-5.
    bound = 1e-6 if oracle.DEVICE == "cpu" else 2e-5
    assert oracle.rel_err(packed(ids), dense(ids)) <= bound
    assert oracle.rel_err(packed(ids[0]), Reference(d_dir).logits(ids[0])) <= oracle.LOGIT_RTOL
