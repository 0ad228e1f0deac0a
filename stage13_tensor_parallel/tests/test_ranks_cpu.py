"""CPU: the other ranks' processes (ranks.py) with parts that need no GPU. Each rank runs what rank 0 sends, in
order; a rank whose part fails or whose process exits surfaces on rank 0 as one line naming it, and afterwards no
rank's process is left running; rank 0, waiting for a step's ids, stops waiting when a rank fails (worker.py)."""
import os
import time
from types import SimpleNamespace

import pytest

from ..ranks import RankError, Ranks
from ..worker import WatchedIds


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


def test_waiting_for_a_step_stops_when_a_rank_fails(ranks, monkeypatch):
    """A step whose ids never come (a collective waiting for the failed rank): the wait aborts the communicator,
    closes every rank and raises the rank's error."""
    monkeypatch.setattr(WatchedIds, "CHECK_EVERY_S", 0.0)
    aborted = []
    never = SimpleNamespace(copied=SimpleNamespace(is_done=False))
    ranks.send("fail_on", 3)
    ids = WatchedIds(never, ranks, SimpleNamespace(abort=lambda: aborted.append(True)))
    with pytest.raises(RankError, match="^rank 3: ValueError"):
        ids.result()
    assert aborted == [True] and ranks.closed and not any(p.is_alive() for p in ranks.procs)
