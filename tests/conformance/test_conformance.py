"""Every impl of the chosen backend vs its op's reference, generated from the registry.

    pytest tests/conformance --backend cpu [--strict] [--seed N] [--shard I/N]

Items: (op, impl, case, dtype). Fresh random inputs per run (the seed is printed in the header),
outputs poisoned before the impl runs (see hwinfer.testing.conformance).
"""
from __future__ import annotations

import pytest

from hwinfer.testing import conformance as conf


def _backend(config) -> str:
    return config.getoption("--backend")


def pytest_generate_tests(metafunc):
    backend = _backend(metafunc.config)
    found, missing = conf.shard_of(*conf.items(backend), metafunc.config.getoption("--shard"))
    if "conf_item" in metafunc.fixturenames:
        metafunc.parametrize("conf_item", found, ids=[i.id for i in found])
    if "uncovered_op" in metafunc.fixturenames:
        metafunc.parametrize("uncovered_op", missing or ["<none>"])


@pytest.fixture(scope="module")
def target(request):
    return conf.target_for(_backend(request.config))


def test_impl_matches_reference(conf_item, target, request):
    strict = request.config.getoption("strict")
    if target.device is None:
        if strict:
            pytest.fail(f"strict: {target.why_absent}")
        pytest.skip(target.why_absent)
    if target.interpret_only and not conf_item.impl.interpretable:
        pytest.skip(f"{conf_item.impl.qualname} is not a Triton kernel the interpreter can run")
    refused = conf_item.impl.when.why_not(target.device)
    if refused:
        pytest.skip(f"{conf_item.impl.qualname} does not run on {target.device.arch}: {refused}")
    missing = conf_item.impl.missing_packages()
    if missing:
        if strict:
            pytest.fail(f"strict: {conf_item.impl.qualname} needs {', '.join(missing)}")
        pytest.skip(f"package {', '.join(missing)} not installed")
    outcome = conf.run_item(conf_item, target.device.torch_device, request.config.hwinfer_seed)
    if outcome.status == "skip":
        pytest.skip(outcome.message)
    if outcome.status == "fail":
        pytest.fail(f"{conf_item.id}: {outcome.message}", pytrace=False)


def test_op_has_impl_on_backend(uncovered_op, request):
    """Strict lanes demand an impl (or a deliberate reference choice) for every op."""
    if uncovered_op == "<none>":
        return
    message = f"op {uncovered_op!r} has no impl on backend {_backend(request.config)}; it falls back to the reference"
    if request.config.getoption("strict"):
        pytest.fail(message)
    pytest.skip(message)
