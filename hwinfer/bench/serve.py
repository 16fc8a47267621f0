"""``hwinfer bench serve``: a serving benchmark against a running OpenAI-compatible server.

Sends ``num_prompts`` streaming /v1/completions requests, at most ``concurrency`` at a time, each
a prompt of ``input_len`` random token ids asking for exactly ``output_len`` tokens
(``ignore_eos``). Per request it measures:

* TTFT: submit to the first streamed text;
* TPOT: ``(e2e - ttft) / (output tokens - 1)``, the mean time per token after the first;
* ITL: every gap between successive streamed chunks (a chunk may carry several tokens);
* e2e: submit to the end of the stream.

The report has mean / median / p90 / p99 of each (milliseconds) and the request and output-token
throughput over the wall time of the run. Token counts come from the server's usage chunk.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

# Token ids for random prompts: low ids exist in every vocabulary (the tiny test models too).
PROMPT_ID_RANGE = (10, 250)


@dataclass
class RequestResult:
    """One request's measurements (seconds); ``error`` set when it failed."""

    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass
class Stats:
    """Summary of one metric, in milliseconds."""

    mean: float
    median: float
    p90: float
    p99: float

    @classmethod
    def of(cls, seconds: list[float]) -> Stats:
        if not seconds:
            return cls(0.0, 0.0, 0.0, 0.0)
        ms = sorted(s * 1000.0 for s in seconds)
        return cls(statistics.fmean(ms), statistics.median(ms), _percentile(ms, 90), _percentile(ms, 99))


@dataclass
class BenchReport:
    """What ``hwinfer bench serve`` prints (and writes with ``--json``)."""

    model: str
    num_prompts: int
    concurrency: int
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float       # requests / s
    output_throughput: float        # output tokens / s
    ttft_ms: Stats
    tpot_ms: Stats
    itl_ms: Stats
    e2e_ms: Stats
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        lines = [f"{'model':<32}{self.model}",
                 f"{'successful / failed requests':<32}{self.completed} / {self.failed}",
                 f"{'concurrency':<32}{self.concurrency}",
                 f"{'duration (s)':<32}{self.duration_s:.2f}",
                 f"{'input / output tokens':<32}{self.total_input_tokens} / {self.total_output_tokens}",
                 f"{'request throughput (req/s)':<32}{self.request_throughput:.2f}",
                 f"{'output throughput (tok/s)':<32}{self.output_throughput:.2f}",
                 f"{'(ms)':<10}{'mean':>10}{'median':>10}{'p90':>10}{'p99':>10}"]
        for name, st in (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms), ("ITL", self.itl_ms), ("E2E", self.e2e_ms)):
            lines.append(f"{name:<10}{st.mean:>10.2f}{st.median:>10.2f}{st.p90:>10.2f}{st.p99:>10.2f}")
        return "\n".join(lines)


def _percentile(sorted_ms: list[float], q: float) -> float:
    """Linear-interpolated percentile of already sorted values."""
    pos = (len(sorted_ms) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_ms) - 1)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (pos - lo)


async def _one(client, model: str, prompt: list[int], output_len: int) -> RequestResult:
    start = time.perf_counter()
    first = last = None
    gaps: list[float] = []
    usage = None
    try:
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=output_len, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].text:
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
    except Exception as exc:  # a failed request is counted, not fatal
        return RequestResult(ok=False, error=f"{type(exc).__name__}: {exc}")
    end = time.perf_counter()
    if first is None:
        return RequestResult(ok=False, error="the stream carried no text")
    tokens = usage.completion_tokens if usage is not None else len(gaps) + 1
    prompt_tokens = usage.prompt_tokens if usage is not None else len(prompt)
    return RequestResult(True, prompt_tokens, tokens, first - start, end - start, gaps)


async def run_bench(base_url: str, *, model: str | None = None, num_prompts: int = 100, concurrency: int = 8,
                    input_len: int = 128, output_len: int = 128, api_key: str | None = None, seed: int = 0,
                    progress: bool = True) -> BenchReport:
    """Run the benchmark (see the module docstring) and return its report."""
    import openai
    from tqdm.asyncio import tqdm

    if num_prompts < 1 or concurrency < 1 or input_len < 1 or output_len < 1:
        raise ValueError("num_prompts, concurrency, input_len and output_len must be >= 1")
    base = base_url.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    rng = random.Random(seed)
    prompts = [[rng.randrange(*PROMPT_ID_RANGE) for _ in range(input_len)] for _ in range(num_prompts)]
    async with openai.AsyncOpenAI(base_url=base, api_key=api_key or "EMPTY", max_retries=0, timeout=600) as client:
        if model is None:
            model = (await client.models.list()).data[0].id
        gate = asyncio.Semaphore(concurrency)

        async def limited(prompt: list[int]) -> RequestResult:
            async with gate:
                return await _one(client, model, prompt, output_len)
        start = time.perf_counter()
        results = await tqdm.gather(*(limited(p) for p in prompts), disable=not progress,
                                    desc="requests", file=sys.stderr)
        duration = time.perf_counter() - start
    return summarize(results, model=model, concurrency=concurrency, duration=duration)


def summarize(results: list[RequestResult], *, model: str, concurrency: int, duration: float) -> BenchReport:
    """The report over every request's measurements."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    return BenchReport(
        model=model, num_prompts=len(results), concurrency=concurrency, completed=len(ok),
        failed=len(results) - len(ok), duration_s=duration,
        total_input_tokens=sum(r.prompt_tokens for r in ok), total_output_tokens=out_tokens,
        request_throughput=len(ok) / duration if duration > 0 else 0.0,
        output_throughput=out_tokens / duration if duration > 0 else 0.0,
        ttft_ms=Stats.of([r.ttft for r in ok]), tpot_ms=Stats.of([r.tpot for r in ok if r.tpot is not None]),
        itl_ms=Stats.of([g for r in ok for g in r.itl]), e2e_ms=Stats.of([r.e2e for r in ok]),
        errors=sorted({r.error for r in results if r.error})[:10])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``hwinfer bench serve`` options."""
    parser.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000 (/v1 optional)")
    parser.add_argument("--model", default=None, help="model id (default: the server's first model)")
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight at most")
    parser.add_argument("--input-len", type=int, default=128, help="prompt tokens (random token ids)")
    parser.add_argument("--output-len", type=int, default=128, help="tokens generated per request (ignore_eos)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    """``hwinfer bench serve``: run, print the report, optionally write it as JSON."""
    try:
        report = asyncio.run(run_bench(args.base_url, model=args.model, num_prompts=args.num_prompts,
                                       concurrency=args.concurrency, input_len=args.input_len,
                                       output_len=args.output_len, api_key=args.api_key, seed=args.seed,
                                       progress=not args.no_progress))
    except ValueError as exc:
        print(f"hwinfer bench serve: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the server could not be reached, ...
        print(f"hwinfer bench serve: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(report.format())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
    return 0 if report.completed else 1
