"""The engine: open and validate a checkpoint, put its weights on the GPU, prove they arrived intact.

No forward pass yet (stage02_forward adds it); the one kernel that uses weights is the embedding gather.
"""
from __future__ import annotations

import numpy as np

from common.checkpoint import Checkpoint
from common.device import DeviceArray, get_gpu
from common.synthetic import resolve_model

from .kernels import Kernels
from .weights import load_weights, verify


class Engine:
    def __init__(self, model: str, max_model_len: int | None = None, progress: bool = False):
        self.folder = resolve_model(model)
        self.checkpoint = Checkpoint(self.folder)          # every validation error is raised here, before the GPU
        self.config = self.checkpoint.config
        self.max_model_len = max_model_len or min(self.config.max_position_embeddings, 4096)
        self.gpu = get_gpu()
        self.kernels = Kernels(self.gpu)
        self.weights = load_weights(self.checkpoint, self.gpu, progress=progress)

    def verify(self) -> list[str]:
        """Names of tensors whose GPU bytes differ from the file's (empty list: all identical)."""
        return verify(self.weights, self.checkpoint, self.kernels)

    def embed(self, token_ids) -> np.ndarray:
        """Hidden rows (T, H) as bf16 bits for the given ids: the first step of every forward pass."""
        ids = np.asarray(token_ids, dtype=np.int32)
        if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise ValueError(f"token ids must be a non-empty 1-D list in [0, {self.config.vocab_size})")
        d_ids = self.gpu.to_device(ids)
        out: DeviceArray = self.gpu.empty((ids.size, self.config.hidden_size), "bf16")
        self.kernels.embedding(d_ids, self.weights["model.embed_tokens.weight"], out)
        return self.gpu.to_host(out)

    def generate(self, prompts, params):
        raise NotImplementedError("this stage only loads and verifies weights; text generation starts in "
                                  "stage02_forward (python -m stage02_forward)")
