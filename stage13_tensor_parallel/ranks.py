"""The other ranks of a model split over GPUs: one process each, driven by rank 0, the engine's own process.

    ranks = Ranks(size, build, args)    start ranks 1 .. size-1 (spawned: a CUDA context does not survive a fork);
                                        rank r builds its part as build(r, size, *args), in its own process
    ranks.send(method, *args)           every other rank calls part.method(*args), in the order sent; no reply
    ranks.call(method, *args)           the same, then wait for each rank's return value (a list, rank 1 first)
    ranks.check()                       raise RankError if a rank has failed or exited
    ranks.watch(on_gone)                from now on a thread looks every 50 ms whether each rank's process lives,
                                        and calls on_gone() once if one has gone
    ranks.close()                       stop them all and wait (graceful=False: terminate them at once)

Each step, rank 0 sends the step's inputs (packing.StepInputs: a few numpy arrays, pickled into a pipe a rank;
bench_ranks.py times it) and every rank launches the same kernels and collectives on its own GPU; only rank 0
reads the sampled ids back. A rank whose method raises sends its error as one line and exits: rank 0 raises it as
RankError. A rank that has gone leaves rank 0's collectives waiting for it forever: the watch's on_gone aborts them
(worker.py), so that rank 0's waits end and it can say which rank failed.
"""
from __future__ import annotations

import multiprocessing
import signal
import threading
import time


class RankError(RuntimeError):
    """A rank failed or exited; the message is its one line."""


class Ranks:
    CHECK_EVERY_S = 0.05

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
        self.closed, self.gone = False, None       # gone: the first rank the watch saw exit
        self._stop_watch = threading.Event()

    def ready(self) -> None:
        """Wait until every rank has built its part (raising the first one's failure)."""
        for r in range(1, self.size):
            self._reply(r, self.start_timeout_s)

    def send(self, method: str, *args) -> None:
        self._send((method, args, False))

    def call(self, method: str, *args) -> list:
        self.send_call(method, *args)
        return self.replies()

    def send_call(self, method: str, *args) -> None:
        """call() without waiting: its replies come with replies() (rank 0 can take part in between)."""
        self._send((method, args, True))

    def replies(self) -> list:
        """Each rank's return value of the last call sent with a reply wanted (call(), or send_call())."""
        return [self._reply(r) for r in range(1, self.size)]

    def check(self) -> None:
        for r, (conn, proc) in enumerate(zip(self.conns, self.procs), start=1):
            if conn.poll():
                self._receive(r)
            if not proc.is_alive():
                self._exited(r)

    def watch(self, on_gone) -> None:
        def look() -> None:
            while not self._stop_watch.wait(self.CHECK_EVERY_S):
                for r, proc in enumerate(self.procs, start=1):
                    if not proc.is_alive():
                        self.gone = r
                        on_gone()
                        return

        threading.Thread(target=look, name="ranks' watch", daemon=True).start()

    def close(self, graceful: bool = True, timeout_s: float = 10) -> None:
        if self.closed:
            return
        self.closed = True
        self._stop_watch.set()
        if graceful:          # each rank reads its pipe: told to stop, it finishes what it was sent and exits
            for conn, proc in zip(self.conns, self.procs):
                if proc.is_alive():
                    try:
                        conn.send(None)
                    except OSError:
                        pass
            deadline = time.monotonic() + timeout_s
            for proc in self.procs:
                proc.join(max(deadline - time.monotonic(), 0))
        for proc in self.procs:          # after a failure a rank may be stuck on its GPU, its pipe unread
            if proc.is_alive():
                proc.terminate()
            proc.join()
        for conn in self.conns:
            conn.close()

    def _send(self, message) -> None:
        for r, conn in enumerate(self.conns, start=1):
            try:
                conn.send(message)
            except OSError:                       # its end is closed: it has gone, perhaps saying why first
                self.check()
                raise RankError(f"rank {r} stopped reading its pipe") from None

    def _reply(self, r: int, timeout_s: float | None = None):
        conn, proc = self.conns[r - 1], self.procs[r - 1]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not conn.poll(self.CHECK_EVERY_S):
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
    """A rank's process: build its part, say so, then run each method sent until told to stop (None) or rank 0 is
    gone. Ctrl-C reaches every process of the terminal: rank 0 alone answers it (it stops the others)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        part = build(rank, size, *args)
        conn.send(("ok", None))
        while True:
            try:
                message = conn.recv()
            except EOFError:                      # rank 0 is gone: so is the engine
                return
            if message is None:
                return
            method, margs, reply = message
            result = getattr(part, method)(*margs)
            if reply:
                conn.send(("ok", result))
    except BaseException as e:                    # noqa: BLE001 - every failure is reported, in one line
        line = f"{type(e).__name__}: {e}".splitlines()[0]
        try:
            conn.send(("error", f"rank {rank}: {line}"))
        except OSError:
            pass
