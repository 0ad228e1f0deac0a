"""A rank's share of the model, on its own GPU: what each process but rank 0's holds (ranks.py starts them), and
rank 0's side of each step.

    Worker(rank, size, folder, ...)     its GPU (device `rank`), its shard of the weights (tensor_parallel.py)
    .join(uid)                          its place in the ranks' NCCL communicator (all ranks at once)
    .allocate(num_blocks)               its Model and its part of the KV cache (rank 0 decides the count)
    .capture(picks)                     its decode graphs, with rank 0's kernel choices (all ranks at once)
    .admit(...), .launch(step)          each step as rank 0 sends it: the same kernels and collectives

    RankedRunner(runner, ranks, comm)   rank 0's runner: every admission and step goes to the other ranks first;
                                        the sampled ids are waited for while the other ranks are watched
"""
from __future__ import annotations

import time

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
                 max_num_batched_tokens: int, block_size: int, enforce_eager: bool):
        self.checkpoint = Checkpoint(folder)
        self.shard = plan(self.checkpoint.config, size)[rank]
        self.part = shard_part(self.checkpoint.config, self.shard)
        self.config = rank_config(self.checkpoint.config, self.shard)
        self.sizes = (max_num_seqs, max_model_len, max_num_batched_tokens, block_size)
        self.enforce_eager = enforce_eager
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


class WatchedIds:
    """A step's sampled ids on rank 0, waited for while the other ranks are watched: if one has failed, the
    collectives it will never join are aborted, every rank is stopped and its error raised (a plain wait would
    hang forever)."""

    CHECK_EVERY_S = 0.05

    def __init__(self, ids, ranks, comm: Communicator):
        self.ids, self.ranks, self.comm = ids, ranks, comm

    def result(self):
        event, next_check = self.ids.copied, time.monotonic() + self.CHECK_EVERY_S
        while not event.is_done:
            if time.monotonic() > next_check:
                self.watch()
                next_check = time.monotonic() + self.CHECK_EVERY_S
        return self.ids.result()

    def watch(self) -> None:
        try:
            self.ranks.check()
        except RankError:                # the step will never finish: stop waiting for it, and every rank
            self.comm.abort()
            self.ranks.close()
            raise


class RankedRunner:
    """GpuRunner on rank 0 of several: admit() and launch() are sent to the other ranks first, so every rank
    launches the same step's kernels and collectives on its own GPU; rank 0 alone reads the sampled ids."""

    def __init__(self, runner: GpuRunner, ranks, comm: Communicator):
        self.runner, self.ranks, self.comm = runner, ranks, comm
        self.model = runner.model

    def admit(self, seq) -> None:
        self.ranks.send("admit", seq.seq_slot, seq.params, seq.seed)
        self.runner.admit(seq)

    def launch(self, x) -> WatchedIds:
        ids = WatchedIds(None, self.ranks, self.comm)
        ids.watch()
        self.ranks.send("launch", x)
        ids.ids = self.runner.launch(x)
        return ids
