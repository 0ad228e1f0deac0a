"""The model as the continuous-batching loop's runner (llm_engine.py): packed rows in, sampled tokens out.

    admit(seq)   the sequence's sampling parameters into its seq_slot, once, when it is admitted
    run(x)       a step of decode rows is the replay of the captured graph of its size (graphs.py), when there
                 are graphs; any other step is one forward launched kernel by kernel over the packed rows of x
                 (packing.StepInputs), then the sampler over its logit rows, each with its seq_slot's
                 parameters. Either way the host reads back n int32 ids
"""
from __future__ import annotations

import numpy as np

from .graphs import DecodeGraphs
from .model import Model
from .packing import StepInputs


class GpuRunner:
    def __init__(self, model: Model, graphs: DecodeGraphs | None = None):
        self.model, self.graphs = model, graphs

    def admit(self, seq) -> None:
        self.model.set_params(seq.seq_slot, seq.params, seq.seed)

    def run(self, x: StepInputs) -> np.ndarray:
        n = len(x.logit_rows)
        if self.graphs is None or self.graphs.launch(x) is None:
            self.model.forward(x)
            if n == 0:
                return np.zeros(0, np.int32)
            self.model.queue_sample_rows(n)
        return self.model.gpu.to_host(self.model.next_ids.view(0, (n,)))     # waits for the GPU
