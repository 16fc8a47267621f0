"""Shared pytest options: the conformance suite's backend selection.

``--strict`` is pytest's own flag (pytest 9: strict markers, config, ids); the conformance suite
reads it too: an op without an impl on the backend, or an absent device, is then a failure.
"""
from __future__ import annotations

import os
import random


def pytest_addoption(parser):
    group = parser.getgroup("hwinfer")
    group.addoption("--backend", action="store", default="cpu",
                    help="backend whose impls the conformance suite checks (cpu, nvidia, amd, xpu, npu)")
    group.addoption("--seed", action="store", type=int, default=None,
                    help="base seed for the random inputs (default: fresh each run, printed)")
    group.addoption("--shard", action="store", default=None,
                    help="I/N: the conformance suite's part I of N (whole ops; part 0 also checks "
                         "missing impls), for a lane run in several calls")


def pytest_configure(config):
    seed = config.getoption("--seed")
    if seed is None:
        seed = int(os.environ.get("HWINFER_TEST_SEED", random.randrange(1 << 30)))
    config.hwinfer_seed = seed


def pytest_report_header(config):
    return [f"hwinfer: backend={config.getoption('--backend')} strict={config.getoption('strict')} "
            f"seed={config.hwinfer_seed} (rerun with --seed {config.hwinfer_seed})"]
