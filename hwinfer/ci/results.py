"""The results CSV every CI lane writes: one schema, documented in ci/README.md.

    op,impl,backend,arch,device,metric,value,unit,commit,date

* ``metric`` ``conformance``: value 1 (every case x dtype that ran passed) or 0 (one failed);
  ``unit`` repeats the status as a word (passed, failed, skipped, reference). ``cases_passed``,
  ``cases_failed``, ``cases_skipped`` count the items (unit ``cases``).
* ``aot_compile``: value 1/0 (unit passed/failed), a Triton kernel compiled for ``arch``.
* ``impl_missing``: value 1, the backend lists no impl for ``op`` (impl empty).
* benchmark numbers: ``us``, ``GB/s``, ``TFLOP/s``, ``pct_of_peak``, each with the shape after
  an ``@`` (``us@8192x4096 bfloat16``), because one op x impl is timed at several shapes.

``device`` is the card's name for runs on hardware; runs without the hardware say so
(``interpreter (host CPU)``, ``aot (no GPU)``, ``fake device``) and never count as validated.
"""
from __future__ import annotations

import csv
import datetime as _dt
import os
import subprocess
from pathlib import Path
from typing import Iterable

FIELDS = ("op", "impl", "backend", "arch", "device", "metric", "value", "unit", "commit", "date")
INTERPRETER = "interpreter (host CPU)"
AOT = "aot (no GPU)"
FAKE = "fake device"
NOT_HARDWARE = (INTERPRETER, AOT, FAKE, "absent", "")


def on_hardware(device: str) -> bool:
    """Whether a row's ``device`` names real hardware (only such rows can validate anything)."""
    return device not in NOT_HARDWARE


def commit_id(root: str | os.PathLike | None = None) -> str:
    """``HWINFER_COMMIT``, else ``git rev-parse --short HEAD``, else ``unknown``."""
    if os.environ.get("HWINFER_COMMIT"):
        return os.environ["HWINFER_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def today() -> str:
    """``HWINFER_RESULTS_DATE``, else today's UTC date (YYYY-MM-DD)."""
    return os.environ.get("HWINFER_RESULTS_DATE") or _dt.datetime.now(_dt.timezone.utc).date().isoformat()


def row(op: str, impl: str, backend: str, arch: str, device: str, metric: str, value: float | int,
        unit: str, commit: str = "", date: str = "") -> dict[str, str]:
    text = f"{value:.6g}" if isinstance(value, float) else str(value)
    return dict(zip(FIELDS, (op, impl, backend, arch, device, metric, text, unit, commit, date)))


def append_rows(path: str | os.PathLike, rows: Iterable[dict[str, str]]) -> int:
    """Append rows to ``path`` (header written when the file is new); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    n = 0
    with path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS, lineterminator="\n")
        if new:
            writer.writeheader()
        for r in rows:
            writer.writerow({k: r.get(k, "") for k in FIELDS})
            n += 1
    return n


def read_rows(*paths: str | os.PathLike) -> list[dict[str, str]]:
    """Rows of every CSV in ``paths`` (files, or folders whose ``*.csv`` are read)."""
    files: list[Path] = []
    for p in map(Path, paths):
        files.extend(sorted(p.glob("*.csv")) if p.is_dir() else [p])
    out: list[dict[str, str]] = []
    for f in files:
        with f.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = set(FIELDS) - set(reader.fieldnames or ())
            if missing:
                raise ValueError(f"{f}: not a results CSV (missing columns {', '.join(sorted(missing))})")
            out.extend({k: r[k] or "" for k in FIELDS} for r in reader)
    return out
