"""Shared oracle checks: hwinfer against transformers 5.23.0 on tiny generated checkpoints.

Each check loads the same files with both libraries (fp32; transformers on the CPU, hwinfer on
``HWINFER_TEST_DEVICE``, default cpu, e.g. ``cuda`` to run the model tests through a GPU
backend's kernels) and compares: logits (max
relative error, relative to the largest reference logit), greedy tokens, cached decode against
full recompute, and loading transformers' own ``save_pretrained`` output.
"""
from __future__ import annotations

import inspect
import os
import shutil
import sys
from pathlib import Path

import torch

from hwinfer import load_model
from hwinfer.runtime.batch import ForwardBatch

LOGIT_RTOL = 1e-4
DEVICE = os.environ.get("HWINFER_TEST_DEVICE", "cpu")
# The oracle compares fp32 logits: off the CPU a checkpoint would otherwise load in its own
# dtype (bf16), which no 1e-4 tolerance survives.
DTYPE = None if DEVICE == "cpu" else "float32"


ORACLE_VERSION = "5.23.0"  # the transformers the test extra pins


def require_pinned_transformers(why: str) -> None:
    """Skip where an older transformers (the GPU machine has 5.17) cannot be the oracle: its FP8
    loader needs the ``kernels`` package or fp8 init kernels the CPU lacks, and some models'
    module names changed in between. CI runs these tests with the pinned version."""
    import pytest
    from packaging.version import Version

    have = __import__("transformers").__version__
    if Version(have) < Version(ORACLE_VERSION):
        pytest.skip(f"transformers {have} cannot serve as this oracle ({why}); needs {ORACLE_VERSION}")


def force_torch_paths(model) -> None:
    """Make transformers run its plain-torch kernels even though fla is installed (it is a test
    dependency for the op oracles; its Triton kernels cannot run on the CPU). The modeling
    module bound fla's functions in place of its own at import; ``__wrapped__`` leads back."""
    module = sys.modules[type(model).__module__]
    for name, fn in list(vars(module).items()):
        if callable(fn) and hasattr(fn, "__wrapped__") and name.startswith(("torch_", "causal_conv1d", "chunk_", "fused_", "recurrent_")):
            setattr(module, name, inspect.unwrap(fn))


def hf_load(path: Path, cls_name: str | None = None):
    transformers = __import__("transformers")
    cls = getattr(transformers, cls_name) if cls_name else transformers.AutoModelForCausalLM
    model, info = cls.from_pretrained(str(path), dtype=torch.float32, output_loading_info=True)
    force_torch_paths(model)
    return model.eval(), info


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    ours, ref = ours.float().cpu(), ref.float().cpu()
    return float((ours - ref).abs().max() / ref.abs().max())


def random_ids(vocab: int, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def check_logits(ours, hf, ids: torch.Tensor) -> float:
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
    got = ours(ids)
    err = rel_err(got, ref)
    assert err <= LOGIT_RTOL, f"logits differ from transformers: max relative error {err:.2e}"
    return err


def check_greedy(ours, hf, prompt: list[int], steps: int = 16) -> list[int]:
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False,
                          min_new_tokens=steps, eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    got = _greedy_no_eos(ours, prompt, steps)
    assert got == ref, f"greedy tokens differ:\n ours {got}\n  hf  {ref}"
    return got


def _greedy_no_eos(model, prompt: list[int], steps: int) -> list[int]:
    saved = model.generation_defaults
    model.generation_defaults = type(saved)(eos_token_ids=())
    try:
        return model.generate(prompt, max_new_tokens=steps, temperature=0).token_ids
    finally:
        model.generation_defaults = saved


def check_cached_equals_full(ours, prompts: list[list[int]], steps: int = 12) -> None:
    """Batched cached decode (prefill once, then one token per step) == full recompute."""
    outs = [_greedy_no_eos(ours, p, steps) for p in prompts]
    for prompt, tokens in zip(prompts, outs):
        full = ours(torch.tensor(prompt + tokens))
        predicted = full[len(prompt) - 1:-1].argmax(-1).tolist()
        assert predicted == tokens, f"cached decode {tokens} != full recompute {predicted}"
    saved = ours.generation_defaults
    ours.generation_defaults = type(saved)(eos_token_ids=())
    try:
        batched = [o.token_ids for o in ours.generate(prompts, max_new_tokens=steps, temperature=0)]
    finally:
        ours.generation_defaults = saved
    assert batched == outs, "batched generation differs from one-request generation"


def check_hf_layout(ours, hf, src: Path, dst: Path, ids: torch.Tensor) -> None:
    """transformers' save_pretrained output loads into hwinfer and gives the same logits."""
    hf.save_pretrained(str(dst))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).exists() and not (dst / name).exists():
            shutil.copy(src / name, dst / name)
    again = load_model(dst, device=DEVICE, dtype=DTYPE)
    assert rel_err(again(ids), ours(ids)) <= LOGIT_RTOL


def check_chunked_prefill(model, prompts: list[list[int]], first: list[int]) -> None:
    """Prefill ``first[i]`` tokens of each prompt, then the rest as one chunk over the cached
    prefix (chunked prefill / prefix-cache hit): every position's logits equal a full forward."""
    n = len(prompts)
    cache, alloc = model.new_cache(n, max(len(p) for p in prompts))
    table, slots = alloc.block_table(model.device), torch.arange(n, device=model.device)
    got: list[list[torch.Tensor]] = [[] for _ in prompts]
    for new, ctx in ((first, [0] * n), ([len(p) - f for p, f in zip(prompts, first)], first)):
        ids = torch.tensor([t for p, c, m in zip(prompts, ctx, new) for t in p[c:c + m]], device=model.device)
        batch = ForwardBatch.step(ids, new, ctx, cache, slots, table)
        with torch.no_grad():
            logits = model.logits(model.forward_batch(batch))
        for i, part in enumerate(logits.split(new)):
            got[i].append(part)
    for prompt, parts in zip(prompts, got):
        assert rel_err(torch.cat(parts), model(torch.tensor(prompt))) <= LOGIT_RTOL


def add_hf_towers(path: Path, cls_name: str, keep: tuple[str, ...]) -> list[str]:
    """Complete a generated VLM checkpoint with the tensors hwinfer does not write (vision /
    audio towers, projectors), as transformers' ``cls_name`` saves them for the same config
    (random values): every key outside the ``keep`` prefixes that the checkpoint lacks. Returns
    the added keys. A sharded checkpoint gets them as one more shard in its index."""
    import json
    import tempfile

    from safetensors.torch import load_file, save_file

    transformers = __import__("transformers")
    model = getattr(transformers, cls_name)(transformers.AutoConfig.from_pretrained(str(path)))
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        theirs = {}
        for f in sorted(Path(tmp).glob("*.safetensors")):
            theirs.update(load_file(str(f)))
    index = path / "model.safetensors.index.json"
    have = set(json.loads(index.read_text())["weight_map"]) if index.exists() else \
        set(load_file(str(path / "model.safetensors")))
    extra = {k: v.contiguous() for k, v in theirs.items() if k not in have and not k.startswith(keep)}
    if index.exists():
        meta = json.loads(index.read_text())
        save_file(extra, str(path / "model-towers.safetensors"), metadata={"format": "pt"})
        meta["weight_map"].update({k: "model-towers.safetensors" for k in extra})
        index.write_text(json.dumps(meta, indent=2))
    else:
        tensors = load_file(str(path / "model.safetensors"))
        tensors.update(extra)
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return sorted(extra)
