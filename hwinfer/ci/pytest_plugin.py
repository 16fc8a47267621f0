"""The conformance-to-CSV bridge: a pytest plugin that writes the real suite's outcomes as
results-CSV rows (schema: :mod:`hwinfer.ci.results`).

    pytest tests/conformance --backend nvidia --strict -p hwinfer.ci.pytest_plugin \\
        --results-csv out.csv

Per op x impl of the conformance suite: a ``conformance`` row (1 passed / 0 otherwise, the
status word in ``unit``) and the case counts; ``impl_missing`` for ops the backend has no impl
for; per Triton kernel x target of ``tests/kernels/test_aot.py``: an ``aot_compile`` row. The
rows are appended, so a lane's several pytest runs build one file.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections import defaultdict
from typing import Any

import pytest

from hwinfer.ci import results



def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hwinfer-ci")
    group.addoption("--results-csv", action="store", default=None,
                    help="append conformance / AOT outcomes to this results CSV")


def _device_columns(backend: str) -> tuple[str, str]:
    from hwinfer.testing.conformance import target_for

    try:
        target = target_for(backend)
    except Exception:  # backend not installed: the suite itself reports that
        return "", "absent"
    dev = target.device
    if dev is None:
        return "", "absent"
    if target.interpret_only:
        return dev.arch, results.INTERPRETER
    if dev.fake:
        return dev.arch, results.FAKE
    return dev.arch, dev.name or dev.describe()


def _aot_ops() -> dict[str, list[tuple[str, str, str]]]:
    """AOT spec name -> [(op, impl name, backend)] of the impls whose target lives in the module
    that declares the spec."""
    import hwinfer.kernels.triton as pkg
    from hwinfer.backend import backends

    impls = [(i.target.partition(":")[0], i.op, i.name, b.name) for b in backends() for i in b.impls()]
    out: dict[str, list[tuple[str, str, str]]] = {}
    for mod in pkgutil.iter_modules(pkg.__path__):
        name = f"{pkg.__name__}.{mod.name}"
        try:
            specs = getattr(importlib.import_module(name), "AOT_SPECS", [])
        except Exception:  # a module that does not import fails its own tests
            continue
        for spec in specs:
            out[spec.name] = [(op, impl, be) for m, op, impl, be in impls if m == name]
    return out


def _aot_backend(target: str) -> str:
    return "nvidia" if target.startswith("sm_") else "amd" if target.startswith("gfx") else target


class _Recorder:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.keys: dict[str, list[tuple]] = {}
        self.counts: dict[tuple, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.reference: set[tuple] = set()
        self.missing: set[tuple] = set()
        self.failed_ids: set[str] = set()

    def collect(self, items: list[pytest.Item]) -> None:
        backend = self.config.getoption("--backend", default="cpu")
        columns = None
        aot_ops = None
        for item in items:
            params: dict[str, Any] = getattr(getattr(item, "callspec", None), "params", {})
            if "conf_item" in params:
                columns = columns or _device_columns(backend)
                ci = params["conf_item"]
                key = ("conformance", ci.op.name, ci.impl.name, backend, *columns)
                if ci.impl.is_reference:
                    self.reference.add(key)
                self.keys[item.nodeid] = [key]
            elif "uncovered_op" in params and params["uncovered_op"] != "<none>":
                columns = columns or _device_columns(backend)
                self.missing.add((params["uncovered_op"], backend, *columns))
            elif "spec" in params and "target" in params and hasattr(params["spec"], "kernel"):
                aot_ops = _aot_ops() if aot_ops is None else aot_ops
                spec, target = params["spec"], params["target"]
                be = _aot_backend(target)
                pairs = [(op, impl) for op, impl, b in aot_ops.get(spec.name, []) if b == be]
                self.keys[item.nodeid] = [("aot", op, impl, be, target, results.AOT)
                                          for op, impl in pairs or [(spec.name, "kernel")]]

    def report(self, rep: pytest.TestReport) -> None:
        keys = self.keys.get(rep.nodeid)
        if not keys:
            return
        if rep.failed:
            outcome = "failed"
        elif rep.skipped:
            outcome = "skipped"
        elif rep.when == "call":
            outcome = "passed"
        else:
            return
        if outcome == "failed":
            if rep.nodeid in self.failed_ids:
                return  # a teardown error after a failed call counts once
            self.failed_ids.add(rep.nodeid)
        for key in keys:
            self.counts[key][outcome] += 1

    def rows(self) -> list[dict[str, str]]:
        commit, date = results.commit_id(self.config.rootpath), results.today()
        out = []
        for key, c in sorted(self.counts.items()):
            kind, op, impl, backend, arch, device = key
            if c["failed"]:
                status = "failed"
            elif c["passed"]:
                status = "passed"
            else:
                status = "reference" if key in self.reference else "skipped"
            metric = "conformance" if kind == "conformance" else "aot_compile"
            out.append(results.row(op, impl, backend, arch, device, metric,
                                   int(status == "passed"), status, commit, date))
            if kind == "conformance":
                for word in ("passed", "failed", "skipped"):
                    out.append(results.row(op, impl, backend, arch, device, f"cases_{word}",
                                           c[word], "cases", commit, date))
        for op, backend, arch, device in sorted(self.missing):
            out.append(results.row(op, "", backend, arch, device, "impl_missing", 1, "", commit, date))
        return out


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--results-csv"):
        config.stash[_STASH] = _Recorder(config)


_STASH = pytest.StashKey[_Recorder]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rec = config.stash.get(_STASH, None)
    if rec is not None:
        rec.collect(items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    rec = _CURRENT.get("rec")
    if rec is not None:
        rec.report(report)


_CURRENT: dict[str, _Recorder] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    rec = session.config.stash.get(_STASH, None)
    if rec is not None:
        _CURRENT["rec"] = rec


def pytest_sessionfinish(session: pytest.Session) -> None:
    rec = session.config.stash.get(_STASH, None)
    if rec is None:
        return
    _CURRENT.pop("rec", None)
    n = results.append_rows(session.config.getoption("--results-csv"), rec.rows())
    session.config.hwinfer_ci_rows = n
