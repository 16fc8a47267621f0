"""Load-time benchmark: seconds per GB for load_model on a generated checkpoint.

    python scripts/bench_load.py [--dir DIR] [--quant fp8] [--device cpu]

Writes a ~0.9 GB Qwen3.5-shaped checkpoint (size "bench") once, then times load_model three
times (the page cache is warm after the first; the first run is reported separately).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from hwinfer import load_model
from hwinfer.testing.checkpoints import write_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default=None)
    parser.add_argument("--quant", default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="hwinfer-bench-load-"))
    if not (root / "config.json").exists():
        start = time.perf_counter()
        write_checkpoint("qwen3_5", root, size="bench", quant=args.quant, shards=4)
        print(f"wrote {root} in {time.perf_counter() - start:.1f} s")
    for run in range(3):
        start = time.perf_counter()
        model = load_model(root, device=args.device, progress=False)
        seconds = time.perf_counter() - start
        gb = model.checkpoint_bytes / 1e9
        print(f"run {run}: {gb:.3f} GB in {seconds:.2f} s = {seconds / gb:.2f} s/GB "
              f"({model.load_report.loaded} tensors, {model.load_report.dequantized} dequantized)")
        del model


if __name__ == "__main__":
    main()
