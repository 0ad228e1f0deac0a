"""The engine: generation with a KV cache, so each decode step computes one token.

    prefill:  run the T-token prompt once, writing every layer's K/V into the cache; sample token T+1
    decode:   run only the newest token at its position, attending over the cached K/V; sample; repeat until
              a stop id, max_tokens or max_model_len
Step n now costs a forward over 1 token plus attention over T + n cached positions, where stage02 re-ran all
T + n tokens. The sampler writes the new id straight into the sequence's id buffer on the GPU; the host reads
back that one int32 per step, to stream it and to check the stop rules.
"""
from __future__ import annotations

import secrets
import numpy as np

from common.checkpoint import Checkpoint
from common.device import DeviceArray, get_gpu
from common.outputs import RequestOutput, Timing, drain
from common.prompts import PromptPreparer
from common.sampling import SamplingParams
from common.synthetic import resolve_model

from .kernels import Kernels
from .model import Model
from .weights import load_weights, verify


class Engine:
    def __init__(self, model: str, max_model_len: int | None = None, progress: bool = False):
        self.folder = resolve_model(model)
        self.checkpoint = Checkpoint(self.folder)          # every validation error is raised here, before the GPU
        self.config = self.checkpoint.config
        self.prompts = PromptPreparer(self.folder, self.config, max_model_len)
        self.tokenizer = self.prompts.tokenizer
        self.max_model_len = self.prompts.max_model_len
        self.gpu = get_gpu()
        self.kernels = Kernels(self.gpu)
        self.weights = load_weights(self.checkpoint, self.gpu, progress=progress)
        self.model = Model(self.weights, self.config, self.gpu, self.kernels, self.max_model_len)
        self.timings: list[Timing] = []                    # one per request of the last generate()

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

    def logits(self, token_ids) -> np.ndarray:
        """Logits (T, V) float32 at every position of one sequence (for tests and comparisons)."""
        ids = self.prompts.encode(list(token_ids))
        self._write_ids(ids)
        out = self.gpu.empty((len(ids), self.config.vocab_size), "f32")
        self.model.forward(0, len(ids), out)
        return self.gpu.to_host(out)

    def decode_logits(self, token_ids, n_prompt: int) -> np.ndarray:
        """Prefill token_ids[:n_prompt], then decode the rest one token at a time through the cache; the logits
        (len - n_prompt + 1, V) f32 that chose each following token (for tests against a full recompute)."""
        ids = self.prompts.encode(list(token_ids))
        self._write_ids(ids)
        steps = [self.gpu.to_host(self.model.forward(0, n_prompt))[0]]
        for pos in range(n_prompt, len(ids)):
            steps.append(self.gpu.to_host(self.model.forward(pos, 1))[0])
        return np.stack(steps)

    def generate(self, prompts, params: SamplingParams | list[SamplingParams]) -> list[RequestOutput]:
        """Run each prompt (text or token ids) to completion, one after another."""
        requests = self.prompts.requests(prompts, params)
        self.timings = []
        return [drain(rid, ids, self.stream(ids, p), self.tokenizer) for rid, (ids, p) in enumerate(requests)]

    def stream(self, prompt, params: SamplingParams):
        """Yield (token id, finish reason or None) as each new token is chosen; records a Timing."""
        timing = Timing(0)
        ids = self.prompts.encode(prompt)
        timing.prompt_tokens = len(ids)
        self.timings.append(timing)
        stop = self.prompts.stop_ids(params)
        seed = params.seed if params.seed is not None else secrets.randbits(64)
        self._write_ids(ids)
        n, new, reason = len(ids), [], None
        while reason is None:
            # prefill runs positions 0..n-1; each decode step only position n-1, the token sampled last
            logits = self.model.forward(0, n) if not new else self.model.forward(n - 1, 1)   # (1, V)
            next_id = self.model.ids.view(4 * n, (1,))                      # the sampler writes ids[n]
            self.kernels.sample(logits.view(0, (self.config.vocab_size,)), next_id, params.temperature,
                                params.top_k, params.top_p, seed, len(new))
            tok = int(self.gpu.to_host(next_id)[0])                         # waits for the GPU
            timing.tick()
            n += 1
            new.append(tok)
            reason = self.prompts.finish_reason(new, n, params, stop)
            yield tok, reason

    def _write_ids(self, ids: list[int]) -> None:
        """Copy the sequence's token ids into model.ids (queued through the pinned staging buffer)."""
        host = np.asarray(ids, dtype=np.int32)
        stage = self.gpu.staging(host.nbytes)
        self.gpu.sync()                                     # the staging buffer may still feed an earlier copy
        stage.array[: host.nbytes] = host.view(np.uint8)
        self.gpu.copy_to_device_async(self.model.ids.ptr, stage.ptr, host.nbytes)
