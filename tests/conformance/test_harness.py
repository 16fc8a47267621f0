"""The harness itself must catch what it is there to catch: an output element left unwritten,
a mutated input, a wrong value, a wrong dtype."""
from __future__ import annotations

import torch

from hwinfer.backend import Impl
from hwinfer.ops import get_op
from hwinfer.testing.conformance import Item, poisoned_allocations, run_item

RMS = get_op("rms_norm")
CASE = RMS.cases[0]


def _item(target: str) -> Item:
    return Item(RMS, Impl("rms_norm", "probe", target, backend="test"), CASE, torch.float32)


def forgets_last_row(x, weight=None, *, eps=1e-6, weight_offset=0.0):
    out = torch.empty_like(x)
    out[:-1] = RMS.reference(x[:-1], weight, eps=eps, weight_offset=weight_offset)
    return out


def mutates_input(x, weight=None, *, eps=1e-6, weight_offset=0.0):
    y = RMS.reference(x, weight, eps=eps, weight_offset=weight_offset)
    x.mul_(2)
    return y


def off_by_a_bit(x, weight=None, *, eps=1e-6, weight_offset=0.0):
    return RMS.reference(x, weight, eps=eps, weight_offset=weight_offset) * 1.001


def wrong_dtype(x, weight=None, *, eps=1e-6, weight_offset=0.0):
    return RMS.reference(x, weight, eps=eps, weight_offset=weight_offset).double()


def correct(x, weight=None, *, eps=1e-6, weight_offset=0.0):
    return RMS.reference(x, weight, eps=eps, weight_offset=weight_offset)


def _run(fn_name: str):
    return run_item(_item(f"{__name__}:{fn_name}"), torch.device("cpu"), base_seed=1234)


def test_unwritten_output_is_caught_by_poison():
    outcome = _run("forgets_last_row")
    assert outcome.status == "fail" and "NaN pattern differs" in outcome.message


def test_mutated_input_is_caught():
    outcome = _run("mutates_input")
    assert outcome.status == "fail" and "modified its input" in outcome.message


def test_value_and_dtype_errors_are_caught():
    assert _run("off_by_a_bit").status == "fail"
    assert "dtype" in _run("wrong_dtype").message


def test_correct_impl_passes():
    assert _run("correct").status == "pass"


def test_poison_fills_empty_allocations_and_restores_torch():
    with poisoned_allocations():
        f = torch.empty(4)
        i = torch.empty(3, dtype=torch.int32)
        n = torch.zeros(2).new_empty(2)
    assert f.isnan().all() and n.isnan().all() and (i == -(2**30) + 7).all()
    assert torch.empty.__name__ == "empty"


def test_shards_split_whole_ops_and_cover_everything():
    from hwinfer.testing.conformance import items, shard_of
    found, missing = items("nvidia")
    missing = missing + ["zz_op_without_impl"]   # a missing-impl check to place
    parts = [shard_of(found, missing, f"{i}/3") for i in range(3)]
    ops = [{item.op.name for item in part} for part, _ in parts]
    assert all(ops), "a part without ops"
    assert not (ops[0] & ops[1] or ops[0] & ops[2] or ops[1] & ops[2]), "an op in two parts"
    assert sorted(i.id for part, _ in parts for i in part) == sorted(i.id for i in found)
    assert [m for _, m in parts] == [missing, [], []]
    assert shard_of(found, missing, None) == (found, missing)
    for bad in ("3/3", "1", "a/b", "-1/2"):
        try:
            shard_of(found, missing, bad)
        except ValueError as exc:
            assert "--shard" in str(exc)
        else:
            raise AssertionError(f"--shard {bad} accepted")


def test_interpreted_runs_get_half_an_ulp_more_for_16_bit_outputs(monkeypatch):
    """The interpreter truncates fp32 -> bf16 / fp16 (GPUs round to nearest): only interpreted
    runs of 16-bit outputs get the extra half-ulp, exact contracts stay exact."""
    from hwinfer.ops.contract import EXACT, Tol
    from hwinfer.testing.conformance import interpreted_tol

    tol = Tol(atol=1e-6, rtol=5e-3, metric="rmse")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert interpreted_tol(tol, torch.bfloat16) == tol
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert interpreted_tol(tol, torch.bfloat16) == Tol(atol=1e-6, rtol=5e-3 + 2.0 ** -9, metric="rmse")
    assert interpreted_tol(tol, torch.float16).rtol == 5e-3 + 2.0 ** -12
    assert interpreted_tol(tol, torch.float32) == tol
    assert interpreted_tol(EXACT, torch.bfloat16) == EXACT
