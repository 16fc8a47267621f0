"""Prometheus metrics of one server: requests, tokens, latencies, queue and cache usage.

Each server owns its own CollectorRegistry, so several servers (tests) never collide.
Counters are updated from the engine thread through :meth:`Metrics.observe`; gauges read the
engine's state when scraped.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from hwinfer.server.engine_handle import Delta, EngineFailure, Stream

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("hwinfer_requests", "Finished requests by finish reason",
                                ["finish_reason"], registry=r)
        self.http_requests = Counter("hwinfer_http_requests", "HTTP requests by endpoint and status",
                                     ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("hwinfer_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("hwinfer_generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram("hwinfer_time_to_first_token_seconds", "Time from submission to the first text",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("hwinfer_time_per_output_token_seconds",
                              "Mean time per output token after the first, per request",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("hwinfer_e2e_request_latency_seconds", "Submission to last token",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.running = Gauge("hwinfer_num_requests_running", "Requests being decoded or prefilled", registry=r)
        self.waiting = Gauge("hwinfer_num_requests_waiting", "Requests queued for admission", registry=r)
        self.cache_usage = Gauge("hwinfer_cache_usage_ratio", "Fraction of cache blocks in use (0..1)", registry=r)

    def bind(self, engine) -> None:
        """Read the engine's queue lengths and cache usage at scrape time."""
        self.running.set_function(lambda: len(engine.scheduler.running))
        self.waiting.set_function(lambda: len(engine.scheduler.waiting))
        self.cache_usage.set_function(engine.pool.usage)

    def observe(self, stream: Stream, msg: Delta | EngineFailure) -> None:
        """Engine-thread hook: one message sent to ``stream``."""
        now = time.perf_counter()
        if isinstance(msg, EngineFailure):
            self.requests.labels("error").inc()
            return
        if stream.first_token is None and msg.num_output_tokens > 0:
            stream.first_token = now
            self.ttft.observe(now - stream.submitted)
        if msg.finish_reason is None:
            return
        self.requests.labels(msg.finish_reason).inc()
        self.prompt_tokens.inc(msg.num_prompt_tokens)
        self.generation_tokens.inc(msg.num_output_tokens)
        self.e2e.observe(now - stream.submitted)
        if stream.first_token is not None and msg.num_output_tokens > 1:
            self.tpot.observe((now - stream.first_token) / (msg.num_output_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
