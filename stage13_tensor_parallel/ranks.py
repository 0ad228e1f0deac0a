"""The other ranks of a model split over GPUs: one process each, driven by rank 0, the engine's own process.

    ranks = Ranks(size, build, args)    start ranks 1 .. size-1 (spawned: a CUDA context does not survive a fork);
                                        rank r builds its part as build(r, size, *args), in its own process
    ranks.send(method, *args)           every other rank calls part.method(*args), in the order sent; no reply
    ranks.call(method, *args)           the same, then wait for each rank's return value (a list, rank 1 first)
    ranks.check()                       raise RankError if a rank has failed or exited
    ranks.close()                       stop them all and wait; a rank that does not stop is terminated

Each step, rank 0 sends the step's inputs (packing.StepInputs: a few numpy arrays, pickled into a pipe a rank;
bench_ranks.py times it) and every rank launches the same kernels and collectives on its own GPU; only rank 0
reads the sampled ids back. A rank whose method raises sends its error as one line and exits: rank 0 raises it as
RankError at its next check, and the engine closes every rank (nothing is left running).
"""
from __future__ import annotations

import multiprocessing
import time


class RankError(RuntimeError):
    """A rank failed or exited; the message is its one line."""


class Ranks:
    def __init__(self, size: int, build, args: tuple = (), start_timeout_s: float = 900):
        ctx = multiprocessing.get_context("spawn")
        if multiprocessing.current_process().daemon:     # the server's engine process (common/serve)
            raise ValueError(f"tensor_parallel_size={size} starts a process a GPU, which the server's engine "
                             "process may not: serve with --no-engine-process")
        self.size, self.start_timeout_s, self.conns, self.procs = size, start_timeout_s, [], []
        for r in range(1, size):
            conn, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(r, size, child, build, args), name=f"rank {r}", daemon=True)
            proc.start()
            child.close()
            self.conns.append(conn)
            self.procs.append(proc)
        self.closed = False

    def ready(self) -> None:
        """Wait until every rank has built its part (raising the first one's failure)."""
        for r in range(1, self.size):
            self._reply(r, self.start_timeout_s)

    def send(self, method: str, *args) -> None:
        for conn in self.conns:
            conn.send((method, args, False))

    def call(self, method: str, *args) -> list:
        for conn in self.conns:
            conn.send((method, args, True))
        return self.replies()

    def replies(self) -> list:
        """Each rank's return value of the last call sent with a reply wanted (call(), or send_call())."""
        return [self._reply(r) for r in range(1, self.size)]

    def send_call(self, method: str, *args) -> None:
        """call() without waiting: its replies come with replies() (rank 0 can take part in between)."""
        for conn in self.conns:
            conn.send((method, args, True))

    def check(self) -> None:
        for r, (conn, proc) in enumerate(zip(self.conns, self.procs), start=1):
            if conn.poll():
                self._receive(r)
            if not proc.is_alive():
                self._exited(r)

    def close(self, timeout_s: float = 10) -> None:
        if self.closed:
            return
        self.closed = True
        for conn in self.conns:
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            proc.join(max(deadline - time.monotonic(), 0))
            if proc.is_alive():
                proc.terminate()
                proc.join()
        for conn in self.conns:
            conn.close()

    def _reply(self, r: int, timeout_s: float | None = None):
        conn, proc = self.conns[r - 1], self.procs[r - 1]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not conn.poll(0.05):
            if not proc.is_alive():
                if conn.poll():                   # its last words came just before it went
                    break
                self._exited(r)
            if deadline is not None and time.monotonic() > deadline:
                raise RankError(f"rank {r} did not answer in {timeout_s:.0f} s")
        return self._receive(r)

    def _receive(self, r: int):
        """Rank r's next message: its reply, or its error raised."""
        try:
            kind, value = self.conns[r - 1].recv()
        except (EOFError, OSError):               # its end of the pipe closed: the process is going
            self._exited(r)
        if kind == "error":
            raise RankError(value)
        return value

    def _exited(self, r: int):
        proc = self.procs[r - 1]
        proc.join(5)
        raise RankError(f"rank {r} exited (code {proc.exitcode})")


def _serve(rank: int, size: int, conn, build, args: tuple) -> None:
    """A rank's process: build its part, say so, then run each method sent until told to stop (None)."""
    try:
        part = build(rank, size, *args)
        conn.send(("ok", None))
        while (message := conn.recv()) is not None:
            method, margs, reply = message
            result = getattr(part, method)(*margs)
            if reply:
                conn.send(("ok", result))
    except EOFError:                              # rank 0 is gone: so is the engine
        pass
    except BaseException as e:                    # noqa: BLE001 - every failure is reported, in one line
        line = f"{type(e).__name__}: {e}".splitlines()[0]
        try:
            conn.send(("error", f"rank {rank}: {line}"))
        except OSError:
            pass
