"""`hwinfer info`: devices found, backends installed, and the op table with reasons."""
from __future__ import annotations

import importlib.metadata
import json
from typing import Any

import torch

from hwinfer.backend import (
    backend_errors, backends, detect_devices, fake_device, resolve_device, select,
)
from hwinfer.backend.device import DeviceInfo


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def gather(device: str = "auto", fake: str | None = None, strict: bool = False) -> dict[str, Any]:
    """Everything `hwinfer info` prints, as data (``--json`` prints exactly this)."""
    devices, detect_errors = detect_devices()
    dev: DeviceInfo = fake_device(fake) if fake else resolve_device(device)
    table = select(dev, strict=strict, bind=not dev.fake)
    by_name = {b.name: b for b in backends()}
    rows = []
    for row in table.report():
        chosen = row["chosen"]
        backend = chosen.split(".")[0] if chosen != "reference" else None
        impl = next((c for c in row["candidates"] if c["status"] == "chosen"), None)
        deliberate = bool(impl) and any(
            i.is_reference for b in backends() for i in b.impls()
            if i.op == row["op"] and i.qualname == chosen)
        rows.append({**row, "kind": ("fallback" if backend is None else
                                     "reference (deliberate)" if deliberate else "impl")})
    return {
        "versions": {"hwinfer": _version("hwinfer"), "torch": torch.__version__,
                     "triton": _version("triton")},
        "backends": [{"name": b.name, "vendors": list(b.vendors), "dist_backend": b.dist_backend,
                      "hardware_status": b.hardware_status, "impls": len(b.impls())}
                     for b in by_name.values()],
        "backend_errors": [e.__dict__ for e in backend_errors()],
        "devices": [d.describe() for d in devices],
        "detect_errors": [e.__dict__ for e in detect_errors],
        "selected_device": dev.describe(),
        "ops": rows,
    }


def render(info: dict[str, Any], verbose: bool = False) -> str:
    v = info["versions"]
    lines = [f"hwinfer {v['hwinfer']}  torch {v['torch']}  triton {v['triton']}", "", "Backends:"]
    for b in info["backends"]:
        lines.append(f"  {b['name']:<7} vendors={','.join(b['vendors'])} comm={b['dist_backend']} "
                     f"impls={b['impls']}  [{b['hardware_status']}]")
    for e in info["backend_errors"]:
        lines.append(f"  {e['name']:<7} FAILED TO LOAD ({e['target']}): {e['error']}")
    lines += ["", "Devices found:"] + [f"  {d}" for d in info["devices"]]
    for e in info["detect_errors"]:
        lines.append(f"  backend {e['backend']} could not detect devices: {e['error']}")
    lines += ["", f"Op table for {info['selected_device']}:"]
    counts: dict[str, int] = {}
    hidden = 0
    width = max(len(r["op"]) for r in info["ops"]) if info["ops"] else 10
    for r in info["ops"]:
        counts[r["kind"]] = counts.get(r["kind"], 0) + 1
        lines.append(f"  {r['op']:<{width}}  {r['chosen']:<22} {r['kind']}")
        other_vendor = []
        for c in r["candidates"]:
            if c["status"] == "chosen":
                continue
            if c["reason"] and "does not serve vendor" in c["reason"] and not verbose:
                other_vendor.append(c["impl"])
                continue
            why = c["reason"] or "eligible, lower priority"
            lines.append(f"  {'':<{width}}    - {c['impl']} (p{c['priority']}): {why}")
        hidden += len(other_vendor)
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    lines += ["", f"{len(info['ops'])} ops: {summary}"]
    if hidden:
        lines.append(f"({hidden} impls of other vendors' backends not shown; -v lists them with reasons)")
    return "\n".join(lines)


def main(device: str, fake: str | None, as_json: bool, verbose: bool, strict: bool) -> int:
    info = gather(device, fake, strict)
    print(json.dumps(info, indent=2) if as_json else render(info, verbose))
    return 0
