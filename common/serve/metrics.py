"""The server's Prometheus metrics (GET /metrics, text format), named as vLLM names its own (vllm: -> tiny_vllm:).

    tiny_vllm:num_requests_running        gauge      requests the engine runs (each holds a seq_slot)
    tiny_vllm:num_requests_waiting        gauge      requests queued for a seq_slot
    tiny_vllm:kv_cache_usage_perc         gauge      the share of the KV cache held (0..1), as vLLM's
    tiny_vllm:prompt_tokens_total         counter    prompt tokens of the requests admitted
    tiny_vllm:generation_tokens_total     counter    tokens generated
    tiny_vllm:prefix_cache_queries_total  counter    prompt tokens looked up in the prefix cache (engines with one)
    tiny_vllm:prefix_cache_hits_total     counter    of which found there
    tiny_vllm:time_to_first_token_seconds histogram  request queued -> its first token
    tiny_vllm:inter_token_latency_seconds histogram  between a request's tokens
    tiny_vllm:request_success_total       counter    finished requests, by finish reason (abort included)
    tiny_vllm:engine_step_seconds         histogram  one engine.step() on the loop's thread (not vLLM's: it says
                                                     whether the server slows the steps themselves)
    tiny_vllm:engine_loop_gap_seconds     histogram  the loop's own time between two steps while requests run

Each server has its own registry, so that two in one process (tests) do not share counts.
"""
from __future__ import annotations

import re

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_STEP_BUCKETS = (0.0001, 0.0003, 0.001, 0.003, 0.01, 0.02, 0.03, 0.05, 0.1, 0.3, 1)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60)


class ServerMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.running = Gauge("tiny_vllm:num_requests_running", "requests the engine runs", registry=r)
        self.waiting = Gauge("tiny_vllm:num_requests_waiting", "requests queued for a seq_slot", registry=r)
        self.kv_cache_usage = Gauge("tiny_vllm:kv_cache_usage_perc", "share of the KV cache held (0..1)",
                                    registry=r)
        self.prompt_tokens = Counter("tiny_vllm:prompt_tokens", "prompt tokens admitted", registry=r)
        self.generation_tokens = Counter("tiny_vllm:generation_tokens", "tokens generated", registry=r)
        self.ttft = Histogram("tiny_vllm:time_to_first_token_seconds", "request queued -> first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("tiny_vllm:inter_token_latency_seconds", "between a request's tokens",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.step_time = Histogram("tiny_vllm:engine_step_seconds", "one engine step", buckets=_STEP_BUCKETS,
                                   registry=r)
        self.loop_gap = Histogram("tiny_vllm:engine_loop_gap_seconds", "loop time between steps",
                                  buckets=_STEP_BUCKETS, registry=r)
        self.finished = Counter("tiny_vllm:request_success", "finished requests", ["finished_reason"], registry=r)
        self.prefix_queries = Counter("tiny_vllm:prefix_cache_queries", "prompt tokens looked up in the prefix cache",
                                      registry=r)
        self.prefix_hits = Counter("tiny_vllm:prefix_cache_hits", "prompt tokens found in the prefix cache",
                                   registry=r)
        self._prefix_seen = (0, 0)

    def count_prefix_cache(self, queries: int, hits: int) -> None:
        """The engine's running totals; the counters take what they add since the last call."""
        q0, h0 = self._prefix_seen
        self.prefix_queries.inc(max(0, queries - q0))
        self.prefix_hits.inc(max(0, hits - h0))
        self._prefix_seen = (queries, hits)

    def text(self) -> bytes:
        return generate_latest(self.registry)


def read_metric(text: str, name: str) -> float:
    """A metric's value in /metrics text, summed over its labels (0 when absent)."""
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))
