"""The engine in a process of its own, behind the step API: what vLLM does with its engine core, for the same reason.

    server process                                        engine process
    EngineLoop thread --add / abort / step--> Pipe -->     the real engine (a stage's, or the numpy one)
                      <--token ids, counts--  Pipe <--

In one process the engine's thread and the event loop's thread share one interpreter lock: while the event loop
turns a step's tokens into 256 server-sent events, the engine's thread may not queue the next step's kernels, and
the GPU waits. Here each process has its own. (`--engine-process`: not yet the default, because it has not yet
been measured against the thread on the H200; on a two-core CPU, where client, server and engine share two cores,
it was 7% slower than the thread.) The engine loop (engine_loop.py) does not change: it drives this
proxy as it would the engine. Each step costs one round trip that carries only the step's new token ids (a
request's earlier tokens stay on this side), and the counts the loop reads between steps come back with every
reply, so they cost no round trip of their own.
"""
from __future__ import annotations

import multiprocessing

from common.checkpoint import Checkpoint
from common.outputs import RequestOutput
from common.prompts import PromptPreparer


class EngineDead(RuntimeError):
    """The engine's process has exited: no request can run any more (vLLM's EngineDeadError)."""


class EngineProcess:
    """The step API of an engine that runs in a child process (spawned: a CUDA context does not survive a fork).
    The child builds it as factory(*args): a GPU engine cannot be sent there, only how to make one
    (`python -m common.serve` passes engines.build_engine with the stage, the model and max_model_len: a function
    the child can import by name)."""

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
            kind, info = "error", [f"it exited with {self._proc.exitcode} before it was ready"]
        if kind == "error":
            self.close()
            raise RuntimeError(f"the engine process failed to start: {info[0]}")
        folder, self.max_model_len, self._state = info
        self.prompts = PromptPreparer(folder, Checkpoint(folder).config, self.max_model_len)
        self._tokens: dict = {}              # request id -> its generated ids so far (this side's copy)
        self.dead: str | None = None         # why the engine's process is gone, once it is

    # ------------------------------------------------------------------ the step API
    def add_request(self, prompt, params, request_id=None, detokenize: bool = True):
        rid = self._call("add_request", prompt, params, request_id, detokenize)
        self._tokens[rid] = []
        return rid

    def abort_request(self, request_id) -> None:
        self._call("abort_request", request_id)
        self._tokens.pop(request_id, None)

    def step(self) -> list[RequestOutput]:
        outs = []
        for rid, new, reason in self._call("step"):
            ids = self._tokens[rid] if reason is None else self._tokens.pop(rid)
            ids += new
            outs.append(RequestOutput(rid, [], ids, "", reason, new, ""))   # prompt ids and text: not carried
        return outs

    def has_unfinished_requests(self) -> bool:
        return self._state[0]

    def num_requests(self) -> tuple[int, int]:
        return self._state[1]

    def kv_cache_usage(self) -> float:
        return self._state[2]

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
        if self.dead:
            raise EngineDead(self.dead)
        try:
            self._conn.send((method, *args))
            kind, value, self._state = self._conn.recv()  # blocks without the GIL while the engine works
        except (EOFError, OSError):                       # it crashed or was killed: nothing in it survives
            self._proc.join(5)
            self.dead = f"the engine process exited (exit code {self._proc.exitcode})"
            self._state, self._tokens = (False, (0, 0), 0.0), {}
            raise EngineDead(self.dead) from None
        if kind == "error":
            raise value
        return value


def _serve_engine(conn, factory, args) -> None:
    """The child: build the engine, then answer calls until told to close (or the parent goes away)."""
    try:
        engine = factory(*args)
    except BaseException as e:  # noqa: BLE001  the parent reports it
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return

    def state():
        return engine.has_unfinished_requests(), engine.num_requests(), engine.kv_cache_usage()

    conn.send(("ready", str(engine.checkpoint.folder), engine.max_model_len, state()))
    while True:
        try:
            method, *args = conn.recv()
        except EOFError:                                  # the server is gone
            return
        if method == "close":
            return
        try:
            if method == "step":                          # only what the step added crosses the pipe
                value = [(o.request_id, list(o.new_token_ids), o.finish_reason) for o in engine.step()]
            else:
                value = getattr(engine, method)(*args)
            conn.send(("ok", value, state()))
        except Exception as e:  # noqa: BLE001  raised again on the server's side
            try:
                conn.send(("error", e, state()))
            except Exception:  # noqa: BLE001  an exception that does not pickle
                conn.send(("error", RuntimeError(f"{type(e).__name__}: {e}"), state()))
