"""``hwinfer bench serve`` against the test server: as a function and through the CLI."""
from __future__ import annotations

import asyncio
import json

from hwinfer.bench.serve import run_bench
from hwinfer.cli import main
from tests.server.conftest import API_KEY, engine_idle

STATS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def _check(report: dict, n: int, input_len: int, output_len: int) -> None:
    assert report["num_prompts"] == n and report["completed"] == n and report["failed"] == 0
    assert report["total_input_tokens"] == n * input_len
    assert report["total_output_tokens"] == n * output_len
    assert report["duration_s"] > 0 and report["request_throughput"] > 0 and report["output_throughput"] > 0
    for name in STATS:
        st = report[name]
        assert set(st) == {"mean", "median", "p90", "p99"}
        assert all(v > 0 for v in st.values()), (name, st)
        assert st["p99"] >= st["p90"] >= st["median"] > 0
    assert report["ttft_ms"]["p99"] <= report["e2e_ms"]["p99"]


def test_bench_serve_function(server):
    report = asyncio.run(run_bench(server.url, num_prompts=5, concurrency=2, input_len=12, output_len=6,
                                   api_key=API_KEY, progress=False))
    assert report.model == "tiny" and not report.errors
    _check(report.to_json(), 5, 12, 6)
    assert engine_idle(server)


def test_bench_serve_cli(server, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", "serve", "--base-url", server.base, "--model", "tiny", "--num-prompts", "4",
               "--concurrency", "4", "--input-len", "8", "--output-len", "5", "--api-key", API_KEY,
               "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "TTFT" in printed and "TPOT" in printed and "output throughput" in printed
    _check(json.loads(out.read_text()), 4, 8, 5)


def test_bench_serve_counts_failures(server):
    report = asyncio.run(run_bench(server.url, num_prompts=2, concurrency=1, input_len=4, output_len=2,
                                   api_key="wrong", model="tiny", progress=False))
    assert report.completed == 0 and report.failed == 2 and report.errors
