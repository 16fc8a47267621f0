"""The `hwinfer` command line: info | ops | conform | aot."""
from __future__ import annotations

import argparse
import sys


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hwinfer", description="hwinfer: one model definition, every accelerator")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="devices, backends, and which impl each op runs with (and why)")
    info.add_argument("--device", default="auto", help="cpu, cuda[:N], xpu[:N], npu[:N] or auto")
    info.add_argument("--fake", default=None, metavar="ARCH",
                      help="show selection for a fake device instead: sm_90, sm_100, gfx942, gfx950, xpu, npu, cpu")
    info.add_argument("--json", action="store_true", help="print the same data as JSON")
    info.add_argument("--verbose", "-v", action="store_true", help="also list other vendors' impls with reasons")
    info.add_argument("--strict", action="store_true", help="error if any op would fall back to the reference")

    ops = sub.add_parser("ops", help="list the op contracts (--markdown: the full catalogue, docs/ops.md)")
    ops.add_argument("--markdown", action="store_true")

    conform = sub.add_parser("conform", help="run the conformance suite for one backend (pytest)")
    conform.add_argument("--backend", default="cpu")
    conform.add_argument("--strict", action="store_true")
    conform.add_argument("pytest_args", nargs="*", help="extra pytest arguments")

    aot = sub.add_parser("aot", help="compile every Triton kernel ahead of time for GPU targets (no GPU needed)")
    aot.add_argument("--targets", default="sm_90,sm_100,gfx942,gfx950")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "info":
        from hwinfer.backend import DeviceNotFound, SelectionError
        from hwinfer.info import main as info_main

        try:
            return info_main(args.device, args.fake, args.json, args.verbose, args.strict)
        except (DeviceNotFound, SelectionError, KeyError) as exc:
            print(f"hwinfer info: {exc}", file=sys.stderr)
            return 2
    if args.command == "ops":
        from hwinfer.catalogue import main as ops_main

        return ops_main(args.markdown)
    if args.command == "conform":
        import pytest

        from hwinfer.testing import conformance

        argv_ = [conformance.suite_path(), "--backend", args.backend, "-q", *args.pytest_args]
        if args.strict:
            argv_.append("--strict")
        return pytest.main(argv_)
    if args.command == "aot":
        from hwinfer.kernels.triton.aot import main as aot_main

        return aot_main(args.targets.split(","))
    return 2


if __name__ == "__main__":
    sys.exit(main())
