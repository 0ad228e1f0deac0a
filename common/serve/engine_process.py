"""The engine in a process of its own, running on its own: what vLLM does with its engine core, for the same reason.

    server process                                         engine process (engine core)
    EngineLoop thread --add_requests / abort--> Pipe -->    between two steps: every message waiting, answered
                      <--replies, each step's new ids--    then step() while there is work, its new ids sent
                                                           at once, without waiting for the server

In one process the engine's thread and the event loop's thread share one interpreter lock: while the event loop
turns a step's tokens into 256 server-sent events, the engine's thread may not queue the next step's kernels, and
the GPU waits. Here each process has its own, and the engine does not wait for the server either: it steps as
long as it has requests, and each step's outputs go into the pipe as one message (only the step's new token ids;
a request's earlier ids stay on the server's side). The server's side reads them when it can: if it falls behind,
the messages queue in the pipe and its next step() takes all of them at once, one merged output per request, so a
slow server means fewer, larger server-sent events, not a slower engine. A call (adding requests, aborting one)
is answered between two steps; the requests that arrived together are added with one message, so 256 clients
arriving at once cost one round trip, not 256. The state the engine loop reads between steps (unfinished, the
counts, the KV cache in use) comes with every message, so it costs no round trip of its own.
"""
from __future__ import annotations

import multiprocessing
import pickle

from common.checkpoint import Checkpoint
from common.outputs import RequestOutput
from common.prompts import PromptPreparer


class EngineDead(RuntimeError):
    """The engine's process has exited: no request can run any more (vLLM's EngineDeadError)."""


class EngineStartError(RuntimeError):
    """The engine's process could not build the engine; __cause__ is what the engine raised there (a bad model
    or option is the user's error: the command line says it in one line)."""


class EngineProcess:
    """The step API of an engine that runs in a child process (spawned: a CUDA context does not survive a fork).
    The child builds it as factory(*args): a GPU engine cannot be sent there, only how to make one
    (`python -m common.serve` passes engines.build_engine with the stage, the model and max_model_len: a function
    the child can import by name). Not thread-safe: one thread (the engine loop's) calls it."""

    def __init__(self, factory, *args, start_timeout_s: float = 900):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_engine, args=(child, factory, args),
                                 name="engine-core", daemon=True)
        self._proc.start()
        child.close()
        if not self._conn.poll(start_timeout_s):
            self.close()
            raise RuntimeError(f"the engine process did not start in {start_timeout_s:.0f} s")
        try:
            kind, *info = self._conn.recv()
        except EOFError:
            kind, info = "error", [RuntimeError(f"it exited with {self._proc.exitcode} before it was ready")]
        if kind == "error":
            self.close()
            raise EngineStartError(f"the engine process failed to start: {type(info[0]).__name__}: {info[0]}"
                                   ) from info[0]
        folder, self.max_model_len, self._state = info
        self.prompts = PromptPreparer(folder, Checkpoint(folder).config, self.max_model_len)
        self._tokens: dict = {}              # request id -> its generated ids so far (this side's copy)
        self._steps: list = []               # ("step", outputs) / ("step_error", exception) not yet taken
        self.dead: str | None = None         # why the engine's process is gone, once it is

    # ------------------------------------------------------------------ the step API
    def add_request(self, prompt, params, request_id=None, detokenize: bool = True):
        (result,) = self.add_requests([(prompt, params, request_id, detokenize)])
        if isinstance(result, Exception):
            raise result
        return result

    def add_requests(self, requests: list[tuple]) -> list:
        """add_request's arguments for each of several requests, sent in one message: each one's id, or the
        exception the engine raised for it (it refused that one alone)."""
        results = self._call("add_requests", requests)
        for r in results:
            if not isinstance(r, Exception):
                self._tokens[r] = []
        return results

    def abort_request(self, request_id) -> None:
        self._call("abort_request", request_id)
        self._tokens.pop(request_id, None)
        # its outputs already here are dropped with it, and a step left with none goes too: it would keep
        # has_unfinished_requests() true for an engine with nothing left to run
        steps = [(kind, _without(value, request_id) if kind == "step" and request_id in value[0] else value)
                 for kind, value in self._steps]
        self._steps = [(kind, value) for kind, value in steps if kind != "step" or value[0]]

    def step(self) -> list[RequestOutput]:
        """Every step the engine made since the last call (waiting for one if there is none yet), merged: one
        output per request, with all of its new ids. An engine step that raised is raised here, in its turn."""
        if not self._steps and not self._state[0]:
            return []                        # it is idle, and stays so until it is sent something
        try:
            if not self._steps:
                self._receive()              # blocks without the GIL while the engine works
            while self._conn.poll():
                self._receive()
        except (EOFError, OSError):
            self._died()
        merged: dict = {}
        while self._steps:
            kind, value = self._steps[0]
            if kind == "step_error":
                if merged:                   # what came before it first; the error at the next call
                    break
                self._steps.pop(0)
                raise value
            self._steps.pop(0)
            rids, counts, ids, finished, cached = value
            at = 0
            for rid, n in zip(rids, counts):
                at += n
                if rid not in self._tokens:  # aborted on this side already
                    continue
                got = merged.setdefault(rid, [[], None, 0])
                got[0] += ids[at - n:at]
                got[1] = finished.get(rid)
                got[2] = max(got[2], cached.get(rid, 0))
        outs = []
        for rid, (new, reason, n_cached) in merged.items():
            ids = self._tokens[rid] if reason is None else self._tokens.pop(rid)
            ids += new
            outs.append(RequestOutput(rid, [], ids, "", reason, new, "", n_cached))   # prompt ids, text: not carried
        return outs

    def has_unfinished_requests(self) -> bool:
        return self._state[0] or bool(self._steps)

    def num_requests(self) -> tuple[int, int]:
        return self._state[1]

    def kv_cache_usage(self) -> float:
        return self._state[2]

    def prefix_cache_stats(self) -> tuple[int, int] | None:
        """The engine's (prefix cache queries, hits) in tokens, or None for an engine without a prefix cache."""
        return self._state[3]

    def reset_prefix_cache(self) -> None:
        """Empty the engine's prefix cache (its RuntimeError, while requests run, is raised here)."""
        self._call("reset_prefix_cache")

    def close(self, timeout: float = 30.0) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(("close",))
            except OSError:
                pass
            self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()

    def _call(self, method: str, *args):
        """Send a call and wait for its answer; the steps that arrive before it are kept for step()."""
        if self.dead:
            raise EngineDead(self.dead)
        try:
            self._conn.send((method, *args))
            while (reply := self._receive()) is None:
                pass
        except (EOFError, OSError):
            self._died()
        kind, value = reply
        if kind == "error":
            raise value
        return value

    def _receive(self):
        """One message: a step's is queued (None returned), a call's answer returned."""
        kind, value, self._state = self._conn.recv()
        if kind in ("step", "step_error"):
            self._steps.append((kind, value))
            return None
        return kind, value

    def _died(self):
        """It crashed or was killed: nothing in it survives."""
        self._proc.join(5)
        self.dead = f"the engine process exited (exit code {self._proc.exitcode})"
        self._state, self._tokens, self._steps = (False, (0, 0), 0.0, None), {}, []
        raise EngineDead(self.dead) from None


def _serve_engine(conn, factory, args) -> None:
    """The child (the engine core): build the engine, then until told to close (or the parent goes away): answer
    every message waiting, and step while there is work, sending each step's outputs as they come."""
    try:
        engine = factory(*args)
    except BaseException as e:  # noqa: BLE001  the parent reports it
        conn.send(("error", _picklable(e)))
        return
    stalled = False      # a step raised: no more steps until the server has answered it (it aborts the requests)

    def busy() -> bool:
        return engine.has_unfinished_requests() and not stalled

    prefix_cache_stats = getattr(engine, "prefix_cache_stats", lambda: None)   # an engine without one: None

    def state():
        return busy(), engine.num_requests(), engine.kv_cache_usage(), prefix_cache_stats()

    def add_requests(requests):
        out = []
        for prompt, params, request_id, detokenize in requests:
            try:
                out.append(engine.add_request(prompt, params, request_id, detokenize))
            except Exception as e:  # noqa: BLE001  that request alone is refused
                out.append(_picklable(e))
        return out

    conn.send(("ready", str(engine.checkpoint.folder), engine.max_model_len, state()))
    while True:
        while not busy() or conn.poll():     # idle: sleep until a message; busy: take the ones waiting
            try:
                method, *args = conn.recv()
            except EOFError:                 # the server is gone
                return
            if method == "close":
                return
            stalled = False
            try:
                value = add_requests(*args) if method == "add_requests" else getattr(engine, method)(*args)
                conn.send(("ok", value, state()))
            except Exception as e:  # noqa: BLE001  raised again on the server's side
                conn.send(("error", _picklable(e), state()))
        try:
            conn.send(("step", _flat(engine.step()), state()))
        except Exception as e:  # noqa: BLE001  the server ends that step's requests
            stalled = True
            conn.send(("step_error", _picklable(e), state()))


def _flat(outputs) -> tuple[list, list, list, dict, dict]:
    """Only what a step added crosses the pipe, in flat lists (request ids, how many new ids each, all the new ids
    end to end, the finish reasons of those that finished, and the prompt tokens found in a prefix cache by those
    whose first tokens these are): a third of the time to pickle and unpickle that one tuple a request takes (~35
    us against ~140 for 256 requests, on a development CPU): time the engine's step would wait for."""
    rids, counts, ids, finished, cached = [], [], [], {}, {}
    for o in outputs:
        rids.append(o.request_id)
        counts.append(len(o.new_token_ids))
        ids += o.new_token_ids
        if o.finish_reason is not None:
            finished[o.request_id] = o.finish_reason
        if o.num_cached_tokens and len(o.token_ids) == len(o.new_token_ids):   # its first output
            cached[o.request_id] = o.num_cached_tokens
    return rids, counts, ids, finished, cached


def _without(step: tuple, rid) -> tuple:
    """A step's flat outputs less one request's."""
    rids, counts, ids, finished, cached = step
    keep, kept_ids, at = [], [], 0
    for r, n in zip(rids, counts):
        if r != rid:
            keep.append((r, n))
            kept_ids += ids[at:at + n]
        at += n
    return ([r for r, _ in keep], [n for _, n in keep], kept_ids, {r: f for r, f in finished.items() if r != rid},
            {r: n for r, n in cached.items() if r != rid})


def _picklable(e: BaseException) -> BaseException:
    """The exception itself if it crosses the pipe, else a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(e).__name__}: {e}")
