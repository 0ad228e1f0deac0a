"""One thread owns the engine and drives its step() while requests exist; HTTP handlers talk to it by messages.

    handler --add(prompt, params)--> inbox --> loop thread: engine.add_request (errors go back to the handler)
                                               (an engine in its own process: those of a burst in one message)
    loop thread: engine.step() --> each RequestOutput's token ids --> that request's asyncio.Queue
                 (one call_soon_threadsafe per step for all of them)
    handler --abort(id)--> inbox --> loop thread: engine.abort_request (a disconnect frees its slot by the next step)
    handler --reset_prefix_cache()--> inbox --> loop thread: engine.reset_prefix_cache (its error to the handler)

The engine is not thread-safe and need not be: only this thread touches it. It hands out token ids only
(detokenize=False): the handlers turn them into text on the event loop's thread, which runs while this one waits
for the GPU, instead of in the gap between two steps, when the GPU waits for this thread (vLLM, for the same
reason, detokenises in its API server process, not in its engine core). Between steps the thread takes every
message waiting in the inbox, so requests arriving during a step join the next one (iteration-level scheduling
seen from outside). With nothing to run it sleeps on the inbox.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import queue
import threading
import time
from dataclasses import dataclass

from .metrics import ServerMetrics


@dataclass(frozen=True)
class Delta:
    """What one step gave one request, copied out of the engine's RequestOutput (whose lists the engine keeps
    extending): the new tokens, the count so far, and the finish reason once there is one."""

    token_ids: list[int]
    num_tokens: int
    finish_reason: str | None
    num_cached_tokens: int = 0   # its prompt tokens found in the engine's prefix cache (usage's cached_tokens)


class EngineFailed(Exception):
    """The request ended without finishing: the engine raised in its step, or the server is shutting down."""


class ShuttingDown(Exception):
    """The loop has stopped; no request is taken any more."""


class NoPrefixCache(Exception):
    """The engine has no prefix cache to reset (engines before stage11)."""


@dataclass
class _Live:
    sink: tuple                  # (the handler's event loop, its asyncio.Queue)
    queued: float                # time.perf_counter() at add
    last: float | None = None    # when its latest token reached the loop


class EngineLoop:
    def __init__(self, engine, metrics: ServerMetrics | None = None):
        self.engine, self.metrics = engine, metrics or ServerMetrics()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()    # a message is put only while the loop takes them (see stop)
        self._stopped = False
        self._live: dict[str, _Live] = {}                      # loop thread only
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.num_running = self.num_waiting = 0                # the engine's counts after the latest step
        self._started = False

    def start(self) -> None:
        self._started = True
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End the loop: every request in flight ends with EngineFailed("server shutting down"), and later
        add() calls raise ShuttingDown. Safe to call more than once, from any thread."""
        self._put(("stop",), missing_ok=True)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ called from the event loop
    async def add(self, prompt_ids: list[int], params) -> tuple[str, asyncio.Queue]:
        """Queue a request; returns its id and the queue its Deltas (or an EngineFailed) arrive on. The engine's
        validation error, if any, is raised here."""
        loop, sink = asyncio.get_running_loop(), asyncio.Queue()
        done: concurrent.futures.Future = concurrent.futures.Future()
        rid = f"cmpl-{next(self._ids)}"
        self._put(("add", rid, prompt_ids, params, (loop, sink), done))
        try:
            await asyncio.shield(asyncio.wrap_future(done))
        except asyncio.CancelledError:     # its client went away while the engine took it: abort it once taken
            done.add_done_callback(lambda f: f.exception() is None and self.abort(rid))
            raise
        return rid, sink

    def abort(self, request_id) -> None:
        self._put(("abort", request_id), missing_ok=True)

    async def reset_prefix_cache(self) -> None:
        """Empty the engine's prefix cache between two steps. Raises NoPrefixCache for an engine without one,
        and the engine's RuntimeError while requests run."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._put(("reset_prefix_cache", done))
        await asyncio.wrap_future(done)

    def _put(self, message, missing_ok: bool = False) -> None:
        with self._lock:
            if self._stopped:
                if missing_ok:
                    return
                raise ShuttingDown("the server is shutting down")
            self._inbox.put(message)

    # ------------------------------------------------------------------ the loop thread
    def _run(self) -> None:
        gpu = getattr(self.engine, "gpu", None)
        if gpu is not None:          # a CUDA context is current per thread: make the engine's current in this one
            gpu.device.set_current()
        last_step_end = None
        while True:
            idle = not self.engine.has_unfinished_requests()
            msgs = [self._inbox.get()] if idle else []     # nothing to run: sleep until a message
            while True:
                try:
                    msgs.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            adds = []
            for m in msgs:
                if m[0] == "add":            # the adds of a burst go to the engine together (see _add_all)
                    adds.append(m)
                    continue
                self._add_all(adds)
                adds = []
                if m[0] == "stop":
                    self._shut_down()
                    return
                if m[0] == "reset_prefix_cache":
                    self._reset_prefix_cache(m[1])
                    continue
                self._abort(m[1])
            self._add_all(adds)
            if self.engine.has_unfinished_requests():
                t0 = time.perf_counter()
                if last_step_end is not None and not idle:   # the loop's own time between two steps
                    self.metrics.loop_gap.observe(t0 - last_step_end)
                self._step()
                last_step_end = time.perf_counter()
                self.metrics.step_time.observe(last_step_end - t0)
            self._count()

    def _add_all(self, adds: list) -> None:
        """Queue the requests that arrived together. An engine in another process takes them in one message
        (add_requests: one round trip for a burst of clients, not one each); each one the engine refuses goes
        back to its handler, and the rest run."""
        if not adds:
            return
        if hasattr(self.engine, "add_requests"):
            try:
                results = self.engine.add_requests([(prompt, params, rid, False)
                                                    for _, rid, prompt, params, *_ in adds])
            except Exception as e:  # noqa: BLE001  no engine to take them (its process died): each handler hears
                results = [e] * len(adds)
        else:
            results = [self._try_add(prompt, params, rid) for _, rid, prompt, params, *_ in adds]
        for (_, rid, prompt, _, sink, done), result in zip(adds, results):
            if isinstance(result, Exception):    # a bad prompt or params: the handler gets it, the loop goes on
                done.set_exception(result)
                continue
            self._live[rid] = _Live(sink, time.perf_counter())
            self.metrics.prompt_tokens.inc(len(prompt))
            done.set_result(rid)

    def _try_add(self, prompt, params, rid):
        try:
            return self.engine.add_request(prompt, params, request_id=rid, detokenize=False)   # the handler does
        except Exception as e:  # noqa: BLE001
            return e

    def _abort(self, rid) -> None:
        if rid in self._live:
            self.engine.abort_request(rid)
            del self._live[rid]
            self.metrics.finished.labels("abort").inc()

    def _reset_prefix_cache(self, done) -> None:
        stats = getattr(self.engine, "prefix_cache_stats", None)     # as _count: None without a prefix cache
        try:
            if stats is None or stats() is None:
                raise NoPrefixCache("the engine has no prefix cache to reset (stage11 and later have one)")
            self.engine.reset_prefix_cache()
        except Exception as e:  # noqa: BLE001  the handler answers it
            done.set_exception(e)
        else:
            done.set_result(None)

    def _step(self) -> None:
        try:
            outs = self.engine.step()
        except Exception as e:  # noqa: BLE001  the engine broke this step: its requests end, the server goes on
            self._fail_all(f"{type(e).__name__}: {e}")
            return
        now, sends = time.perf_counter(), []
        m = self.metrics
        ttft, itl = [], []
        for o in outs:
            live = self._live.get(o.request_id)
            if live is None:                 # aborted while its step ran
                continue
            (ttft if live.last is None else itl).append(now - (live.queued if live.last is None else live.last))
            live.last = now
            sends.append((live.sink, Delta(list(o.new_token_ids), len(o.token_ids), o.finish_reason,
                                           o.num_cached_tokens)))
            if o.finish_reason is not None:
                del self._live[o.request_id]
                m.finished.labels(o.finish_reason).inc()
        # counted before they are sent: a client that has its tokens finds them (and its request gone) in /metrics
        m.generation_tokens.inc(sum(len(d.token_ids) for _, d in sends))
        for hist, values in ((m.ttft, ttft), (m.itl, itl)):
            for v in values:
                hist.observe(v)
        self._count()
        self._send_all(sends)

    def _count(self) -> None:
        self.num_running, self.num_waiting = self.engine.num_requests()
        self.metrics.running.set(self.num_running)
        self.metrics.waiting.set(self.num_waiting)
        self.metrics.kv_cache_usage.set(self.engine.kv_cache_usage())
        stats = getattr(self.engine, "prefix_cache_stats", None)     # an engine with a prefix cache
        if stats is not None and (now := stats()) is not None:
            self.metrics.count_prefix_cache(*now)

    @property
    def dead(self) -> str | None:
        """Why no request can run any more (the engine's process died), or None."""
        return getattr(self.engine, "dead", None) or (None if self._thread.is_alive() or not self._started
                                                       else "the engine loop has stopped")

    def _fail_all(self, why: str) -> None:
        for rid, live in list(self._live.items()):
            try:
                self.engine.abort_request(rid)
            except Exception:  # noqa: BLE001  a dead engine cannot abort; the request ends here all the same
                pass
            self._send(live.sink, EngineFailed(why))
            self.metrics.finished.labels("abort").inc()
        self._live.clear()

    def _shut_down(self) -> None:
        with self._lock:                     # from here on _put() refuses: nothing can land in the inbox unread
            self._stopped = True
        while True:
            try:
                m = self._inbox.get_nowait()
            except queue.Empty:
                break
            if m[0] in ("add", "reset_prefix_cache"):           # their handlers wait on the last item
                m[-1].set_exception(ShuttingDown("the server is shutting down"))
        self._fail_all("server shutting down")
        self._count()

    @classmethod
    def _send(cls, sink, item) -> None:
        cls._send_all([(sink, item)])

    @staticmethod
    def _send_all(sends) -> None:
        """Hand a step's items to their queues with one wake-up per event loop, not one per request: each
        call_soon_threadsafe writes to the loop's wake-up socket and makes the loop thread take the GIL."""
        by_loop: dict = {}
        for (loop, q), item in sends:
            by_loop.setdefault(loop, []).append((q, item))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:             # that event loop is closed: nobody is listening
                pass


def _deliver(items) -> None:
    for q, item in items:
        q.put_nowait(item)
