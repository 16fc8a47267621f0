"""scripts/find_syncs.py's ``HostCopies`` (pageable host-to-device copies, which torch's sync
debug mode does not report), checked with the meta device standing in for an accelerator."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from find_syncs import HostCopies  # noqa: E402


def test_host_copies_counts_pageable_tensors_into_device_work_only():
    found = Counter()
    x = torch.zeros(4, device="meta")
    with HostCopies(found):
        x * torch.tensor(2.0)                          # a 0-dim host scalar: no copy
        torch.ones(3) + torch.ones(3)                  # host work alone
        x + torch.tensor([1.0, 2.0, 3.0, 4.0]).to("meta")   # a host list copied over
        x[torch.tensor([0, 2])]                        # a host index into device data
    assert sorted(site.split(")")[0] for site in found.elements()) == [
        "pageable copy (_to_copy.default", "pageable copy (index.Tensor"], found
