"""Run a test script under TRITON_INTERPRET=1 in a fresh interpreter (the flag is read when
triton is imported, so it cannot be switched on inside an already-running test session)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_interpreted(script: str, timeout: int = 600) -> None:
    """Fail with the script's stderr unless it exits 0 and prints ``ok``."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=timeout)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]
