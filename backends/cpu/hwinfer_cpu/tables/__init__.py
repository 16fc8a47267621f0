"""The CPU backend's impl table, one module per op family."""
from __future__ import annotations

import importlib

from hwinfer.backend import Impl

FAMILIES = (
    "attention", "block_sparse", "compressor", "conv", "hyper_connection", "indexer",
    "linear_attention", "moe", "norm", "quant", "rope", "sampling", "sparse_mla",
)


def all_impls() -> list[Impl]:
    impls: list[Impl] = []
    for family in FAMILIES:
        impls.extend(importlib.import_module(f"{__name__}.{family}").IMPLS)
    return impls
