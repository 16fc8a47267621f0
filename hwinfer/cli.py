"""The `hwinfer` command line: info | ops | conform | aot | ledger | serve | generate | chat | bench."""
from __future__ import annotations

import argparse
import sys

from hwinfer.cache.spec import KV_FORMATS, LEDGER_FORMATS

# The stored KV format of the caches a serving command allocates (CausalLM.set_kv_format).
_KV_HELP = ("cache storage: auto / bf16 = the compute dtype (default); fp8 = DeepSeek-V4's packed "
            "fp8_ds_mla rows (584 B per 512-wide entry; other models refuse it)")


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

    ledger = sub.add_parser("ledger", help="cache memory per request: bytes per token, fixed bytes, total, "
                                           "entries attended per decode step, per layer kind")
    ledger.add_argument("model", metavar="MODEL_OR_CONFIG",
                        help="checkpoint directory, config.json, or preset name (see hwinfer.presets)")
    ledger.add_argument("--context", required=True, help="context length in tokens: 8192, 128K, 1M (K = 1024)")
    ledger.add_argument("--json", action="store_true", help="print the ledger as JSON (bytes)")
    ledger.add_argument("--kv-format", default="deployed", choices=LEDGER_FORMATS,
                        help="deployed: each architecture's deployed format (default); auto: the "
                             "model dtype, as load_model allocates by default; bf16; fp8")
    _add_serving_commands(sub)
    bench = sub.add_parser("bench", help="benchmarks: serve (latency / throughput against a running server)")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    from hwinfer.bench.serve import add_arguments as add_bench_serve

    add_bench_serve(bench_sub.add_parser("serve", help="streaming completion requests against a running "
                                                       "OpenAI-compatible server: TTFT, TPOT, ITL, e2e"))
    return parser


def _add_serving_commands(sub) -> None:
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server (no PATH: the embedded tiny default model)")
    serve.add_argument("path", nargs="?", default=None, help="checkpoint directory (default: embedded tiny model)")
    serve.add_argument("--device", default="auto", help="cpu, cuda[:N], xpu[:N], npu[:N] or auto")
    serve.add_argument("--dtype", default=None, help="compute dtype (default: checkpoint's; fp32 on the CPU)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: local only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes")
    serve.add_argument("--served-model-name", default=None, help="model id clients use (default: the directory name)")
    serve.add_argument("--max-model-len", type=int, default=None, help="context limit in tokens")
    serve.add_argument("--max-num-seqs", type=int, default=16)
    serve.add_argument("--cache-bytes", type=int, default=None, help="cache pool budget in bytes")
    serve.add_argument("--enable-prefix-caching", action="store_true")
    serve.add_argument("--tp", "--tensor-parallel", dest="tp", type=int, default=1,
                       help="tensor parallelism: shard the model over N processes, one per device (docs/parallel.md)")
    serve.add_argument("--ep", "--expert-parallel", dest="ep", type=int, default=1,
                       help="expert parallelism: 1, or the same N as --tp to spread MoE experts over those ranks")
    serve.add_argument("--kv-format", default="auto", choices=KV_FORMATS, help=_KV_HELP)
    serve.add_argument("--log-level", default="info")

    for name, helptext in (("generate", "stream a completion of PROMPT to the terminal"),
                           ("chat", "interactive chat on stdin (one turn per line; /exit ends)")):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("path", nargs="?" if name == "chat" else None, default=None,
                         help="checkpoint directory" + (" (default: embedded tiny model)" if name == "chat" else ""))
        if name == "generate":
            cmd.add_argument("prompt")
        else:
            cmd.add_argument("--system", default=None, help="system message")
        cmd.add_argument("--device", default="auto")
        cmd.add_argument("--kv-format", default="auto", choices=KV_FORMATS, help=_KV_HELP)
        cmd.add_argument("--max-tokens", type=int, default=128)
        cmd.add_argument("--temperature", type=float, default=None)
        if name == "generate":
            cmd.add_argument("--seed", type=int, default=None)


def _serving(args: argparse.Namespace) -> int:
    if args.command == "serve":
        try:
            from hwinfer.server.app import serve
        except ImportError as exc:
            print(f"hwinfer serve: {exc}; install the server extra: pip install -e '.[server]'", file=sys.stderr)
            return 2
        from hwinfer.parallel.driver import check_sizes, is_follower_process
        from hwinfer.server.state import ServerConfig

        try:
            check_sizes(args.tp, args.ep)
        except ValueError as exc:
            print(f"hwinfer serve: {exc}", file=sys.stderr)
            return 2
        if is_follower_process(args.tp):
            # A torchrun rank other than 0: serve rank 0's model calls (no HTTP), exit with it.
            from hwinfer.api import load_model
            from hwinfer.server.default_model import default_checkpoint

            load_model(args.path or default_checkpoint(), device=args.device, dtype=args.dtype,
                       tensor_parallel=args.tp, expert_parallel=args.ep, kv_format=args.kv_format)
            return 0
        config = ServerConfig(model_path=args.path, device=args.device, dtype=args.dtype,
                              served_model_name=args.served_model_name, api_key=args.api_key,
                              max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                              cache_bytes=args.cache_bytes, enable_prefix_caching=args.enable_prefix_caching,
                              tensor_parallel=args.tp, expert_parallel=args.ep, kv_format=args.kv_format)
        serve(config, host=args.host, port=args.port, log_level=args.log_level)
        return 0
    from hwinfer.interactive import chat_main, generate_main

    try:
        if args.command == "generate":
            return generate_main(args.path, args.prompt, args.device, args.max_tokens, args.temperature, args.seed,
                                 kv_format=args.kv_format)
        return chat_main(args.path, args.device, args.max_tokens, args.temperature, args.system,
                         kv_format=args.kv_format)
    except (ValueError, OSError) as exc:
        print(f"hwinfer {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


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
    if args.command == "ledger":
        return _ledger(args)
    if args.command in ("serve", "generate", "chat"):
        return _serving(args)
    if args.command == "bench":
        from hwinfer.bench.serve import main as bench_serve_main

        return bench_serve_main(args)
    if args.command == "aot":
        from hwinfer.kernels.triton.aot import main as aot_main

        return aot_main(args.targets.split(","))
    return 2


def _ledger(args: argparse.Namespace) -> int:
    import json

    from hwinfer.engine.ledger import format_table, ledger, parse_context
    from hwinfer.loader.config import ConfigError

    try:
        led = ledger(args.model, context=parse_context(args.context), kv_format=args.kv_format)
    except (ConfigError, ValueError) as exc:
        print(f"hwinfer ledger: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(led.to_json(), indent=2) if args.json else format_table(led))
    return 0


if __name__ == "__main__":
    sys.exit(main())
