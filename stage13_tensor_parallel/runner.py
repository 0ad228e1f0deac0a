"""The model as the continuous-batching loop's runner (llm_engine.py): packed rows in, sampled tokens out.

    admit(seq)        the sequence's sampling parameters into its seq_slot, once, when it is admitted (they
                      reach the GPU with the next launch's inputs)
    launch(x) -> ids  queue a step: a step of decode rows is the replay of the captured graph of its size
                      (graphs.py), when there are graphs; any other step is one forward launched kernel by kernel
                      over the packed rows of x (packing.StepInputs), then the sampler over its logit rows, each
                      with its seq_slot's parameters. Either way the n sampled int32 ids are copied back
                      asynchronously; ids.result() waits for them. launch() itself does not wait for the GPU,
                      on a decode step or any other (its copies take turns in pinned buffers: Model.copy_in), so
                      the loop can plan the next step while this one runs
"""
from __future__ import annotations

import numpy as np

from common.device import PinnedBuffer

from .graphs import DecodeGraphs
from .model import Model
from .packing import StepInputs


class SampledIds:
    """A launched step's sampled ids, on their way to a pinned buffer."""

    def __init__(self, pinned: PinnedBuffer, n: int, copied):
        self.pinned, self.n, self.copied = pinned, n, copied

    def result(self) -> np.ndarray:
        """The (n,) int32 ids; waits for the copy (and so for the step)."""
        self.copied.sync()
        return self.pinned.array[: 4 * self.n].view(np.int32).copy()


class GpuRunner:
    def __init__(self, model: Model, graphs: DecodeGraphs | None = None):
        self.model, self.graphs, self.gpu = model, graphs, model.gpu
        # two: the loop reads a step's ids while the next step, launched before, copies its own into the other
        self._ids, self._turn = [PinnedBuffer(4 * model.max_num_seqs) for _ in range(2)], 0

    def admit(self, seq) -> None:
        self.model.set_params(seq.seq_slot, seq.params, seq.seed)

    def launch(self, x: StepInputs) -> SampledIds:
        n = len(x.logit_rows)
        if self.graphs is None or self.graphs.launch(x) is None:
            self.model.forward(x)
            if n:
                self.model.queue_sample_rows(n)
        pinned, self._turn = self._ids[self._turn], self._turn ^ 1
        if n:
            self.gpu.copy_to_host_async(pinned.ptr, self.model.next_ids.ptr, 4 * n)
        return SampledIds(pinned, n, self.gpu.stream.record())
