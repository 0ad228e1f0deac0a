"""A rank's share of the model, on its own GPU: what each process but rank 0's holds (ranks.py starts them), and
rank 0's side of each step.

    Worker(rank, size, folder, ...)     its GPU (device `rank`), its shard of the weights (tensor_parallel.py)
    .join(uid)                          its place in the ranks' NCCL communicator (all ranks at once)
    .allocate(num_blocks)               its Model and its part of the KV cache (rank 0 decides the count)
    .capture(picks)                     its decode graphs, with rank 0's kernel choices (all ranks at once)
    .admit(...), .launch(step)          each step as rank 0 sends it: the same kernels and collectives

    Split(ranks)                        rank 0's hold on the others: .join(uid, gpu) (watched), .check(), .stop()
    RankedRunner(runner, split)         rank 0's runner: every admission and step goes to the other ranks first;
                                        a rank gone is raised at the next launch or read of ids
"""
from __future__ import annotations

import threading

from common.checkpoint import Checkpoint
from common.device import Gpu

from .communicator import Communicator
from .graphs import DecodeGraphs
from .kernels import Kernels
from .model import Model
from .ranks import RankError
from .runner import GpuRunner
from .tensor_parallel import plan, rank_config, shard_tensor
from .weights import load_weights, verify


def shard_part(config, shard):
    """part(name, array) for load_weights: the shard's part of each checkpoint tensor."""
    return lambda name, array: shard_tensor(name, array, config, shard)


class Worker:
    def __init__(self, rank: int, size: int, folder: str, max_model_len: int, max_num_seqs: int,
                 max_num_batched_tokens: int, block_size: int):
        self.checkpoint = Checkpoint(folder)
        self.shard = plan(self.checkpoint.config, size)[rank]
        self.part = shard_part(self.checkpoint.config, self.shard)
        self.config = rank_config(self.checkpoint.config, self.shard)
        self.sizes = (max_num_seqs, max_model_len, max_num_batched_tokens, block_size)
        self.gpu = Gpu(rank)
        self.kernels = Kernels(self.gpu)
        self.weights = load_weights(self.checkpoint, self.gpu, progress=False, part=self.part, vocab=self.shard.vocab)
        self.comm = self.model = self.runner = None

    def join(self, uid: bytes) -> None:
        self.comm = Communicator(self.shard.rank, self.shard.size, uid, self.gpu)

    def allocate(self, num_blocks: int) -> None:
        self.model = Model(self.weights, self.config, self.gpu, self.kernels, *self.sizes, comm=self.comm)
        self.model.allocate_cache(num_blocks)
        self.runner = GpuRunner(self.model)

    def capture(self, picks: dict) -> None:
        graphs = DecodeGraphs(self.model)
        graphs.capture(picks)
        self.runner = GpuRunner(self.model, graphs)

    def admit(self, seq_slot: int, params, seed: int) -> None:
        self.model.set_params(seq_slot, params, seed)

    def launch(self, step) -> None:
        self.runner.launch(step)

    def forward(self, step, logit_rows: int) -> None:
        """A forward outside the loop (rank 0's logits(), decode_logits()): the logits into a scratch buffer."""
        out = self.gpu.empty((logit_rows, self.config.vocab_size), "f32") if logit_rows else None
        self.model.forward(step, out)
        self.gpu.sync()

    def verify(self) -> list[str]:
        return verify(self.weights, self.checkpoint, self.kernels, self.part)


class Split:
    """Rank 0's hold on a split model: the other ranks and its communicator, stopped together, once (the engine's
    close(), its finalizer, or a rank's failure)."""

    def __init__(self, ranks):
        self.ranks, self.comm = ranks, None

    def join(self, uid: bytes, gpu) -> Communicator:
        """Rank 0's place in the communicator, taken on a helper thread while the others are watched: NCCL's init
        waits for every rank, and would wait forever for one that failed first."""
        joined: dict = {}

        def join() -> None:
            try:
                joined["comm"] = Communicator(0, self.ranks.size, uid, gpu)
            except BaseException as e:           # noqa: BLE001 - raised on the engine's thread below
                joined["error"] = e

        helper = threading.Thread(target=join, name="rank 0 joins", daemon=True)
        helper.start()
        while helper.is_alive():
            helper.join(self.ranks.CHECK_EVERY_S)
            if helper.is_alive():
                self.ranks.check()
        if "error" in joined:
            raise joined["error"]
        self.comm = joined["comm"]
        self.ranks.watch(self.comm.abort)        # from now on a rank gone aborts the collectives rank 0 waits on
        return self.comm

    def check(self) -> None:
        """Raise a failed rank's line (RankError), everything stopped first; nothing if all are well."""
        try:
            self.ranks.check()
            if self.ranks.gone is not None:
                raise RankError(f"rank {self.ranks.gone} exited")
        except RankError:
            self.stop(graceful=False)
            raise

    def stop(self, graceful: bool = True) -> None:
        if self.comm is not None:
            if graceful and self.ranks.gone is None:
                self.comm.close()
            else:
                self.comm.abort()
        self.ranks.close(graceful and self.ranks.gone is None)


class CheckedIds:
    """A step's sampled ids on rank 0, read back, then the ranks checked: if one has gone, its collectives were
    aborted (Split.join's watch), the ids are not to be trusted, and its failure is raised instead."""

    def __init__(self, ids, split: Split):
        self.ids, self.split = ids, split

    def result(self):
        ids = self.ids.result()
        if self.split.ranks.gone is not None:
            self.split.check()
        return ids


class RankedRunner:
    """GpuRunner on rank 0 of several: admit() and launch() are sent to the other ranks first, so every rank
    launches the same step's kernels and collectives on its own GPU; rank 0 alone reads the sampled ids."""

    def __init__(self, runner: GpuRunner, split: Split):
        self.runner, self.split = runner, split
        self.model = runner.model

    def admit(self, seq) -> None:
        self._send("admit", seq.seq_slot, seq.params, seq.seed)
        self.runner.admit(seq)

    def launch(self, x) -> CheckedIds:
        self.split.check()
        self._send("launch", x)
        return CheckedIds(self.runner.launch(x), self.split)

    def _send(self, method: str, *args) -> None:
        try:
            self.split.ranks.send(method, *args)
        except RankError:
            self.split.stop(graceful=False)
            raise
