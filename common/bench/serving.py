"""The server under load, in the shape of vLLM's benchmark_serving: the workload's requests sent as streaming
completions by concurrent clients, against the same requests through the engine directly, in one run.

    python -m common.bench_serving --stage 05 [--workload ragged] [--concurrency 256] [--request-rate inf]
                                   [--repeats 3] [--fault] [--out bench-results]

1. direct: the engine alone on the workload (common.bench's worker: a fresh process, generate(); for `chat`, its
   conversations through the step API).
2. server: `python -m common.serve` in its own process on a loopback port; every run sends each request as
   `POST /v1/completions` with `stream: true` (its token ids as the prompt, greedy, ignore_eos, its max_tokens),
   at most --concurrency at a time, arriving all at once or as a Poisson process of --request-rate per second.
   `chat` sends its conversations as a chat client does: each turn when the answer before it has finished, its
   prompt every earlier message and answer (the answer's token ids, asked for with vLLM's return_token_ids)
   followed by its own message; the fault run sends the turns' messages alone.
   Per run: output tok/s (completion tokens / the run's wall time), TTFT and inter-token latency p50 and p99.
   After every run /metrics must show no request running or waiting and no KV cache held. An engine with a
   prefix cache starts every run with it empty (POST /reset_prefix_cache), as the engine alone does, and each
   run records the prompt tokens looked up in it and found there.
3. --fault: one more run where 20% of the clients disconnect after a random number of tokens and 5% of the
   requests are malformed; every other request must complete with all its tokens, each malformed one must get
   a 400, and /metrics must again read zero.

The server's overhead is 1 - server tok/s / direct tok/s (medians); the target is below 10%.

    python -m common.bench_serving --model tiny --probe-huge-prompt 5

measures something else: the largest gap a running stream sees while a 5 MB prompt arrives (probe_huge_prompt).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.bench import USER_RESULTS
from common.bench.client import StreamResult, post_stream
from common.bench.harness import UnknownEngine, environment, run_worker, stage_module
from common.bench.workloads import WORKLOADS, make_conversations, make_requests
from common.device import has_gpu
from common.serve.metrics import read_metric

SERVED = sorted(name for name, w in WORKLOADS.items() if w.requests)   # not `load`: it has no requests

DISCONNECT_SHARE, MALFORMED_SHARE = 0.20, 0.05
IDLE_METRICS = ("tiny_vllm:num_requests_running", "tiny_vllm:num_requests_waiting", "tiny_vllm:kv_cache_usage_perc")
PREFIX_METRICS = {"prefix_cache_queries": "tiny_vllm:prefix_cache_queries_total",
                  "prefix_cache_hits": "tiny_vllm:prefix_cache_hits_total"}
MALFORMED = (b'{"model": "m", "prompt": [1, 2, 3], "max_tokens": ',            # cut off: not JSON
             b'{"model": "m", "prompt": [1, 2, 3], "temperature": "hot"}',     # a wrong type
             b'{"model": "m", "prompt": [1, 2, 3], "max_tokens": 0}',          # an invalid value
             b'{"model": "m", "prompt": [1, 2, 3], "n": 3}')                   # refused: one choice only


@dataclass
class Planned:
    """One request of a run: its body, and what the client will do with it."""

    body: bytes
    max_tokens: int
    disconnect_after: int | None = None     # close the stream after this many text events
    malformed: bool = False


def plan(requests, model: str, fault: bool, seed: int = 0) -> list[Planned]:
    rng = np.random.default_rng(seed)
    out = []
    for i, (prompt, p) in enumerate(requests):
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": p.max_tokens, "temperature": 0,
                           "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
        item = Planned(body.encode(), p.max_tokens)
        draw = rng.random()
        if fault and draw < MALFORMED_SHARE:
            item = Planned(MALFORMED[i % len(MALFORMED)].replace(b'"m"', json.dumps(model).encode()), 0,
                           malformed=True)
        elif fault and draw < MALFORMED_SHARE + DISCONNECT_SHARE:
            item.disconnect_after = int(rng.integers(1, max(2, p.max_tokens)))   # before its last token
        out.append(item)
    return out


async def send_all(host: str, port: int, planned: list[Planned], concurrency: int, rate: float, seed: int = 0
                   ) -> tuple[list[StreamResult], float]:
    """Every planned request, at most `concurrency` in flight, arriving at `rate` per second (inf: at once).
    Returns the results in plan order and the run's wall time."""
    gate, rng = asyncio.Semaphore(concurrency), np.random.default_rng(seed)
    gaps = np.zeros(len(planned)) if rate == float("inf") else rng.exponential(1 / rate, len(planned))

    async def one(item: Planned, at: float) -> StreamResult:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
        async with gate:
            return await post_stream(host, port, "/v1/completions", item.body, item.disconnect_after)

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(p, at) for p, at in zip(planned, np.cumsum(gaps))))
    return list(results), time.perf_counter() - t0


async def send_conversations(host: str, port: int, conversations, model: str, concurrency: int
                             ) -> tuple[list[Planned], list[StreamResult], float, dict]:
    """Every conversation's turns in order, each sent when the answer before it has finished, at most `concurrency`
    requests in flight. Returns every turn's plan and result, the run's wall time and the median time to first
    token of each turn (ms), as measure.chat_once has them for the engine alone."""
    gate, done = asyncio.Semaphore(concurrency), []

    async def talk(c: int) -> None:
        history: list[int] = []
        for k, (message, p) in enumerate(conversations[c]):
            history = history + message
            item = Planned(json.dumps({"model": model, "prompt": history, "max_tokens": p.max_tokens,
                                       "temperature": 0, "ignore_eos": True, "stream": True,
                                       "return_token_ids": True,
                                       "stream_options": {"include_usage": True}}).encode(), p.max_tokens)
            async with gate:
                r = await post_stream(host, port, "/v1/completions", item.body)
            done.append((k, item, r))
            if r.error or r.status != 200:
                return                              # check() reports it; its next turns would build on nothing
            history = history + r.token_ids

    t0 = time.perf_counter()
    await asyncio.gather(*(talk(c) for c in range(len(conversations))))
    wall = time.perf_counter() - t0
    turns = max((len(c) for c in conversations), default=0)
    firsts = [[r.ttft for j, _, r in done if j == k and r.ttft is not None] for k in range(turns)]
    ttft = {f"ttft_ms_turn{k + 1}": 1e3 * statistics.median(v) for k, v in enumerate(firsts) if v}
    return [p for _, p, _ in done], [r for _, _, r in done], wall, ttft


def check(planned: list[Planned], results: list[StreamResult]) -> list[str]:
    """What went wrong: a complete request short of its tokens, an error, a malformed one not refused."""
    wrong = []
    for i, (p, r) in enumerate(zip(planned, results)):
        if p.malformed:
            if r.status != 400:
                wrong.append(f"request {i}: malformed, got HTTP {r.status} instead of 400")
        elif p.disconnect_after is None and (r.status != 200 or r.error or r.completion_tokens != p.max_tokens
                                             or r.finish_reason != "length"):
            wrong.append(f"request {i}: HTTP {r.status}, {r.completion_tokens} of {p.max_tokens} tokens, "
                         f"finish {r.finish_reason}, error {r.error}")
    return wrong


def figures(planned: list[Planned], results: list[StreamResult], wall_s: float) -> dict:
    done = [r for p, r in zip(planned, results) if not p.malformed and p.disconnect_after is None]
    ttft = [r.ttft for r in done if r.ttft is not None]
    itl = [x for r in done for x in r.itls]

    def pct(xs, q):
        return 1e3 * float(np.percentile(xs, q)) if xs else float("nan")

    return {"output_tok_per_s": sum(r.completion_tokens or 0 for r in done) / wall_s, "wall_s": wall_s,
            "completed": len(done), "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
            "itl_p50_ms": pct(itl, 50), "itl_p99_ms": pct(itl, 99)}


def step_means(url: str) -> dict:
    """The server's mean engine step and mean loop gap so far (ms), from its /metrics histograms: against the
    engine alone's step, they say whether serving slows the steps or adds time between them."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for key, name in (("step", "tiny_vllm:engine_step_seconds"), ("gap", "tiny_vllm:engine_loop_gap_seconds")):
        n = read_metric(text, name + "_count")
        out[key] = (read_metric(text, name + "_sum"), n)
    return out


def reset_prefix_cache(url: str) -> bool:
    """Empty the server's prefix cache, so that a run does not find the blocks of the runs before it (the engine
    alone starts each run cold too: measure.generate_once). False for an engine without one (its 400); any other
    refusal ends the benchmark rather than let it measure a warm cache."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url + "/reset_prefix_cache", b"", method="POST"),
                                    timeout=60):
            return True
    except urllib.error.HTTPError as e:
        if e.code == 400:
            return False
        raise SystemExit(f"POST /reset_prefix_cache: HTTP {e.code}: {e.read().decode(errors='replace')}") from None


def prefix_counts(url: str) -> dict:
    """The prefix cache's counters so far (prompt tokens looked up, found), from /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {key: read_metric(text, name) for key, name in PREFIX_METRICS.items()}


def timed_run(url: str, send) -> tuple:
    """send() (a coroutine: send_all or send_conversations) from an empty prefix cache, where the engine has one;
    what it returns, then the prompt tokens this run looked up in it and found there (none without one)."""
    cached = reset_prefix_cache(url)
    before = prefix_counts(url)
    out = asyncio.run(send)
    after = prefix_counts(url)
    return *out, ({k: int(after[k] - before[k]) for k in after} if cached else {})


def idle_metrics(url: str, wait_s: float = 10.0) -> dict:
    """The idle gauges once the server has caught up (an abort lands at the engine's next step)."""
    deadline = time.monotonic() + wait_s
    while True:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        values = {name: read_metric(text, name) for name in IDLE_METRICS}
        if not any(values.values()) or time.monotonic() > deadline:
            return values
        time.sleep(0.1)


class ServerProcess:
    """`python -m common.serve` on a free loopback port, its output in a log file."""

    def __init__(self, stage: str, model: str, max_model_len: int, log: Path, engine_process: bool = True,
                 start_timeout_s: float = 900):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "common.serve", "--stage", stage, "--model", model, "--port", str(self.port),
             "--max-model-len", str(max_model_len), "--max-waiting", str(10**9)]
            + ([] if engine_process else ["--no-engine-process"]),
            stdout=self.log, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited with {self.proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        self.close()
        raise SystemExit(f"the server did not answer /health in {start_timeout_s:.0f} s; see {log}")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def serve_runs(url: str, requests, model: str, concurrency: int, rate: float, repeats: int, fault: bool,
               conversations=None) -> dict:
    """The timed runs (of `conversations`, where given: chat's), then the fault run over `requests`."""
    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
    warm = plan(requests[:8], model, fault=False)
    asyncio.run(send_all(host, port, warm, concurrency, float("inf")))      # kernels, allocator, connections
    runs, problems = [], []
    for i in range(repeats):
        before = step_means(url)
        if conversations is None:
            planned = plan(requests, model, fault=False)
            results, wall, prefix = timed_run(url, send_all(host, port, planned, concurrency, rate, seed=i))
            turns = {}
        else:
            planned, results, wall, turns, prefix = timed_run(url, send_conversations(host, port, conversations,
                                                                                      model, concurrency))
        problems += check(planned, results)
        after = step_means(url)
        means = {f"mean_{k}_ms": 1e3 * (after[k][0] - before[k][0]) / max(1.0, after[k][1] - before[k][1])
                 for k in after}
        runs.append(figures(planned, results, wall) | turns | means | prefix | {"idle_after": idle_metrics(url)})
        print(f"server run {i + 1} of {repeats}: " + json.dumps(runs[-1]), file=sys.stderr, flush=True)
    out = {"runs": runs, "problems": problems}
    if fault:
        planned = plan(requests, model, fault=True, seed=1)
        results, wall, prefix = timed_run(url, send_all(host, port, planned, concurrency, rate, seed=99))
        out["fault"] = figures(planned, results, wall) | prefix | {
            "disconnected": sum(p.disconnect_after is not None for p in planned),
            "malformed": sum(p.malformed for p in planned), "problems": check(planned, results),
            "idle_after": idle_metrics(url)}
        print("fault run: " + json.dumps(out["fault"])[:400], file=sys.stderr, flush=True)
    return out


HUGE_PROMPT_LINE = "The quick brown fox jumps over the lazy dog. "


async def probe_huge_prompt(host: str, port: int, model: str, megabytes: float, stream_tokens: int) -> dict:
    """The largest gap between two events of a running stream while a huge prompt arrives. One stream generates
    (greedy, ignore_eos); once it is steady, a non-streaming completion whose prompt is `megabytes` of text is
    sent (longer than max_model_len, it is refused once encoded: its whole cost is the server's reading and
    encoding it). Against the stream's largest gap before it, the gap during it is what every other client of the
    server waits while the prompt is encoded."""
    stream = StreamResult()
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": stream_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    reader = asyncio.ensure_future(post_stream(host, port, "/v1/completions", body, result=stream))
    while len(stream.arrivals) < 20:                 # a steady stream first
        if reader.done():
            raise SystemExit(f"the probe's stream ended after {len(stream.arrivals)} events: {stream.error}")
        await asyncio.sleep(0.01)
    text = (HUGE_PROMPT_LINE * int(megabytes * 1e6 / len(HUGE_PROMPT_LINE) + 1))[:int(megabytes * 1e6)]
    big = json.dumps({"model": model, "prompt": text, "max_tokens": 1}).encode()
    t0 = time.perf_counter()
    answer = await post_stream(host, port, "/v1/completions", big)
    t1 = time.perf_counter()
    seen = len(stream.arrivals)
    while len(stream.arrivals) < seen + 2 and not reader.done():     # the event that ends the gap
        await asyncio.sleep(0.01)
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    arrivals = stream.arrivals
    gaps = list(zip(arrivals, arrivals[1:]))
    return {"prompt_mb": megabytes, "huge_request_s": t1 - t0, "huge_request_status": answer.status,
            "max_gap_before_ms": 1e3 * max(b - a for a, b in gaps if b < t0),
            "max_gap_during_ms": 1e3 * max((b - a for a, b in gaps if b > t0 and a < t1), default=float("nan"))}


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.bench_serving", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", default="05", help="the stage served, from 05 on (default: %(default)s)")
    ap.add_argument("--model", default="llama-3.2-1b", help="a preset or checkpoint folder (default: %(default)s)")
    ap.add_argument("--workload", default="ragged", choices=SERVED,
                    help="the requests (common/bench/workloads.py; default: %(default)s; cpu: requests for the "
                         "tiny preset, with --model tiny, where there is no GPU)")
    ap.add_argument("--concurrency", type=int, default=256, help="clients at once (default: %(default)s)")
    ap.add_argument("--request-rate", type=float, default=float("inf"), help="requests per second (inf: at once)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs (default: %(default)s)")
    ap.add_argument("--fault", action="store_true", help="and a run with disconnects and malformed requests")
    ap.add_argument("--no-direct", action="store_true", help="skip the engine-direct run")
    ap.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                    help="the server's engine in a process of its own (the default), or on a thread of the server's")
    ap.add_argument("--num-requests", type=int, help="only the workload's first N requests (a smoke run)")
    ap.add_argument("--probe-huge-prompt", type=float, metavar="MB",
                    help="instead of the load runs: the largest gap a stream sees while a prompt of MB megabytes "
                         "arrives, --repeats times")
    ap.add_argument("--out", type=Path, default=USER_RESULTS,
                    help="where the result file and the server's log go (default: %(default)s/, which git ignores)")
    a = ap.parse_args(argv)
    w = WORKLOADS[a.workload]
    ok, why = has_gpu()
    if not ok and (a.model != "tiny" or (a.workload != "cpu" and a.probe_huge_prompt is None)):
        ap.error(f"no GPU ({why}): without one the server serves the tiny preset over a stage's own loop; "
                 "use --model tiny --workload cpu")
    try:
        stage = stage_module(a.stage)
    except UnknownEngine as e:
        ap.error(f"--stage: {e}")
    if a.probe_huge_prompt is not None:
        return probe_main(a, w.max_model_len)
    started = datetime.datetime.now(datetime.timezone.utc)
    record = {"workload": f"serving-{a.workload}", "model": a.model, "stage": stage,
              "date": started.date().isoformat(), "time": started.strftime("%H:%M:%S"),
              "environment": environment(), "concurrency": a.concurrency, "request_rate": a.request_rate,
              "repeats": a.repeats, "num_requests": a.num_requests or w.requests,
              "engine": "its own process" if a.engine_process else "a thread of the server's process"}
    if not a.no_direct:
        if a.num_requests:
            raise SystemExit("--num-requests is for smoke runs of the server alone: add --no-direct")
        record["direct"] = run_worker(a.stage, a.model, a.workload, a.repeats, None, verbose=False)
        print("direct: " + json.dumps(record["direct"])[:400], file=sys.stderr, flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(a.stage, a.model, w.max_model_len, a.out / f"server-{a.workload}.log",
                           a.engine_process)
    try:
        requests = make_requests(a.workload)[:a.num_requests]
        conversations = make_conversations(a.workload)[:a.num_requests] if w.turns > 1 else None
        record["server"] = serve_runs(server.url, requests, a.model, a.concurrency, a.request_rate, a.repeats,
                                      a.fault, conversations)
    finally:
        server.close()
    runs = record["server"]["runs"]
    summary = {k: median_of(runs, k) for k in ("output_tok_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
                                                "itl_p99_ms")}
    summary["output_tok_per_s_range"] = [min(r["output_tok_per_s"] for r in runs),
                                         max(r["output_tok_per_s"] for r in runs)]
    if "direct" in record and "runs" in record["direct"]:
        direct = median_of(record["direct"]["runs"], "output_tok_per_s")
        summary["direct_output_tok_per_s"] = direct
        summary["overhead"] = 1 - summary["output_tok_per_s"] / direct
    record["summary"] = summary
    gpu = (record["environment"].get("gpu") or "cpu").replace(" ", "-")
    path = a.out / f"{gpu}_{record['date']}_serving-{a.workload}-{a.stage}_{started.strftime('%H%M%S')}.json"
    path.write_text(json.dumps(record, indent=2))
    print(json.dumps(summary, indent=1))
    bad = record["server"]["problems"] + record["server"].get("fault", {}).get("problems", [])
    idle = [r["idle_after"] for r in runs] + ([record["server"]["fault"]["idle_after"]] if a.fault else [])
    busy = [m for m in idle if any(m.values())]
    for p in bad[:20]:
        print(f"problem: {p}")
    if busy:
        print(f"problem: /metrics not idle after a run: {busy}")
    print(f"wrote {path}")
    return 1 if bad or busy else 0


def probe_main(a, max_model_len: int) -> int:
    """--probe-huge-prompt: a server of its own, the probe --repeats times, each printed as a JSON line."""
    a.out.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(a.stage, a.model, max_model_len, a.out / "server-probe.log", a.engine_process)
    try:
        for _ in range(a.repeats):
            print(json.dumps(asyncio.run(probe_huge_prompt("127.0.0.1", server.port, a.model, a.probe_huge_prompt,
                                                           max_model_len - 8))), flush=True)
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
