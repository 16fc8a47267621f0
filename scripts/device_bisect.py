"""Which kernel makes a model check fail on this device? Re-run one oracle check with each
impl the model uses swapped for the op's reference (HWINFER_IMPL), one at a time,
then all at once. Run from the repository root on the GPU machine:

    PYTHONPATH=. python3 scripts/device_bisect.py qwen3_5:cached kimi_linear:logits

Checks: ``cached`` (single-request greedy decode == argmax of a full recompute, the oracle's
check_cached_equals_full without the batched part), ``logits`` (max relative error against
transformers in fp32 on the CPU). One line per configuration: the override and the result.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from hwinfer import load_model
from hwinfer.testing.checkpoints import write_checkpoint
from tests.models import oracle

DEVICE = os.environ.get("HWINFER_TEST_DEVICE", "cuda")


def _load(path: Path, override: dict[str, str], shadow: str = "off"):
    os.environ["HWINFER_IMPL"] = ",".join(f"{op}={impl}" for op, impl in override.items())
    os.environ["HWINFER_SHADOW"] = shadow
    try:
        return load_model(path, device=DEVICE, dtype="float32")
    finally:
        os.environ.pop("HWINFER_IMPL", None)
        os.environ.pop("HWINFER_SHADOW", None)


def check_cached(model, _hf) -> str:
    ids = oracle.random_ids(model.config["vocab_size"], 3, 70, seed=3)
    bad = []
    for prompt in (ids[0, :5].tolist(), ids[1, :70].tolist(), ids[2, :33].tolist()):
        tokens = oracle._greedy_no_eos(model, prompt, 12)
        full = model(torch.tensor(prompt + tokens))
        predicted = full[len(prompt) - 1:-1].argmax(-1).tolist()
        first = next((i for i, (a, b) in enumerate(zip(tokens, predicted)) if a != b), None)
        bad.append("ok" if first is None else f"diverges at step {first}")
    return "; ".join(bad)


def check_logits(model, hf) -> str:
    ids = oracle.random_ids(model.config["vocab_size"], 2, 40)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
    err = oracle.rel_err(model(ids), ref)
    return f"rel err {err:.2e} ({'ok' if err <= oracle.LOGIT_RTOL else 'FAIL'})"


CHECKS = {"cached": check_cached, "logits": check_logits}


def bisect(arch: str, check: str) -> None:
    path = Path(tempfile.mkdtemp(prefix=f"bisect_{arch}_"))
    write_checkpoint(arch, path)
    hf = oracle.hf_load(path)[0] if check == "logits" else None
    base = _load(path, {})
    kernels = sorted(name for name, c in base.ops.choices.items() if c.chosen is not None)
    print(f"== {arch}:{check}; impls chosen: "
          + ", ".join(f"{k}={base.ops.chosen(k)}" for k in kernels), flush=True)
    configs = [("default", {}, "off"), ("default again", {}, "off"), ("HWINFER_SHADOW=warn", {}, "warn")]
    configs += [(f"{op}=reference", {op: "reference"}, "off") for op in kernels]
    configs += [("all of them=reference", {op: "reference" for op in kernels}, "off")]
    for label, override, shadow in configs:
        start = time.perf_counter()
        try:
            result = CHECKS[check](_load(path, override, shadow), hf)
        except Exception as exc:  # report and go on: one broken config must not hide the rest
            result = f"error {type(exc).__name__}: {str(exc)[:200]}"
        print(f"  {label:<32} {result}  [{time.perf_counter() - start:.1f} s]", flush=True)


if __name__ == "__main__":
    for spec in sys.argv[1:] or ["qwen3_5:cached", "kimi_linear:logits"]:
        arch, _, check = spec.partition(":")
        bisect(arch, check or "cached")
