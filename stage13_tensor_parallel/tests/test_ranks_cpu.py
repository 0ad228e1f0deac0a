"""CPU: the other ranks' processes (ranks.py) with parts that need no GPU. Each rank runs what rank 0 sends, in
order; a rank whose part fails or whose process exits surfaces on rank 0 as one line naming it, and afterwards no
rank's process is left running; rank 0, waiting to join or for a step's collectives, stops waiting when a rank
fails (worker.py's Split, with a communicator that records its abort)."""
import os
import threading
import time
from types import SimpleNamespace

import pytest

from ..ranks import RankError, Ranks


class Part:
    """A rank's part that keeps a sum; `fail_on` and `exit_on` plant a failure on one rank."""

    def __init__(self, rank: int, size: int, start: int = 0):
        self.rank, self.sum = rank, start

    def add(self, x: int) -> None:
        self.sum += x

    def total(self) -> tuple[int, int]:
        return self.rank, self.sum

    def fail_on(self, rank: int) -> None:
        if self.rank == rank:
            raise ValueError(f"planted on rank {rank}\nsecond line")

    def exit_on(self, rank: int) -> None:
        if self.rank == rank:
            os._exit(3)


def failing_build(rank: int, size: int):
    raise MemoryError(f"cannot allocate on GPU {rank}")


def until_raises(check, timeout_s: float = 60):
    """check() until it raises RankError (a process's exit takes a moment to show); returns the error's text."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            check()
        except RankError as e:
            return str(e)
        time.sleep(0.01)
    pytest.fail("no rank failure seen")


@pytest.fixture
def ranks():
    r = Ranks(4, Part, (10,))
    r.ready()
    yield r
    r.close()
    assert not any(p.is_alive() for p in r.procs)


def test_every_rank_runs_what_rank_0_sends_in_order(ranks):
    ranks.send("add", 1)
    ranks.send("add", 2)
    assert ranks.call("total") == [(1, 13), (2, 13), (3, 13)]
    ranks.send_call("total")
    assert ranks.replies() == [(1, 13), (2, 13), (3, 13)]
    ranks.check()


def test_a_rank_that_raises_is_one_line_naming_it_and_nothing_is_left_running(ranks):
    ranks.send("fail_on", 2)
    with pytest.raises(RankError, match=r"^rank 2: ValueError: planted on rank 2$"):
        ranks.call("total")
    ranks.close()
    assert not any(p.is_alive() for p in ranks.procs)


def test_a_rank_whose_process_exits_is_seen(ranks):
    ranks.send("exit_on", 1)
    assert until_raises(ranks.check) == "rank 1 exited (code 3)"


def test_a_rank_that_cannot_build_its_part_fails_the_start():
    r = Ranks(2, failing_build)
    try:
        with pytest.raises(RankError, match=r"^rank 1: MemoryError: cannot allocate on GPU 1$"):
            r.ready()
    finally:
        r.close()
    assert not r.procs[0].is_alive()


class FakeComm:
    def __init__(self, *args):
        self.aborted = threading.Event()

    def abort(self):
        self.aborted.set()


class StuckComm(FakeComm):
    """NCCL's init waiting for every rank: here, forever."""

    def __init__(self, *args):
        super().__init__()
        threading.Event().wait()


def test_a_rank_gone_mid_step_aborts_rank_0_s_collectives_and_its_failure_is_raised(ranks, monkeypatch):
    """The watch sees the rank's process gone and aborts the communicator (a wait for the step's collectives would
    never end otherwise); the step's ids, read after, are not trusted: the rank's line is raised, every rank
    stopped."""
    from .. import worker

    monkeypatch.setattr(worker, "Communicator", FakeComm)
    split = worker.Split(ranks)
    comm = split.join(b"", None)
    ranks.send("exit_on", 2)
    assert comm.aborted.wait(60)
    ids = worker.CheckedIds(SimpleNamespace(result=lambda: "ids"), split)
    with pytest.raises(RankError, match=r"^rank 2 exited \(code 3\)$"):
        ids.result()
    assert ranks.closed and not any(p.is_alive() for p in ranks.procs)


def test_rank_0_waiting_to_join_stops_when_a_rank_fails(ranks, monkeypatch):
    from .. import worker

    monkeypatch.setattr(worker, "Communicator", StuckComm)
    ranks.send("fail_on", 1)
    with pytest.raises(RankError, match=r"^rank 1: ValueError: planted on rank 1$"):
        worker.Split(ranks).join(b"", None)


def test_sending_to_a_rank_that_is_gone_is_its_failure(ranks):
    ranks.send("exit_on", 3)
    until_raises(ranks.check)
    with pytest.raises(RankError, match="rank 3"):
        for _ in range(1000):              # until its end of the pipe is seen closed
            ranks.send("add", 1)
