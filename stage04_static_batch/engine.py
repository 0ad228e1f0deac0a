"""The engine: static batching. Up to max_batch_size requests run as one batch, from one batched prefill
to the end of the longest of them.

    for each batch (requests in arrival order, max_batch_size at a time):
        prefill:  every prompt, right-padded, in as few forwards as fit; sample each sequence's first token
        decode:   one row per sequence (its seq_slot), each at its own position over its own cache region;
                  sample each row with its own parameters; a finished sequence's row idles until the whole batch
                  is done
A decode step reads the weights once for all B rows, so it costs about what stage03's step for one sequence
cost, and yields B tokens. The host reads back B int32 ids per step, to stream them and check the stop rules.
"""
from __future__ import annotations

import secrets
from typing import Callable

import numpy as np

from common.checkpoint import Checkpoint
from common.device import DeviceArray, get_gpu
from common.outputs import RequestOutput, Timing
from common.prompts import PromptPreparer
from common.sampling import SamplingParams
from common.synthetic import resolve_model

from .batch import BatchStats, Sequence, StaticBatch, plan_batches
from .kernels import Kernels
from .model import Model
from .weights import load_weights, verify

MAX_BATCH_SIZE = 64                # vLLM calls it max_num_seqs
MAX_NUM_BATCHED_TOKENS = 16384     # rows per forward: a 1B prefill GEMM is compute-bound long before this, and it
#                                    bounds the activation buffers (~1.1 GiB for the 1B model)


class Engine:
    def __init__(self, model: str, max_model_len: int | None = None, max_batch_size: int = MAX_BATCH_SIZE,
                 max_num_batched_tokens: int | None = None, progress: bool = False):
        self.folder = resolve_model(model)
        self.checkpoint = Checkpoint(self.folder)          # every validation error is raised here, before the GPU
        self.config = self.checkpoint.config
        self.prompts = PromptPreparer(self.folder, self.config, max_model_len)
        self.tokenizer = self.prompts.tokenizer
        self.max_model_len = self.prompts.max_model_len
        self.max_batch_size = max_batch_size
        tokens = (max(MAX_NUM_BATCHED_TOKENS, self.max_model_len) if max_num_batched_tokens is None
                  else max_num_batched_tokens)
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size!r} must be an integer >= 1")
        if tokens < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens={tokens} must be >= max_model_len={self.max_model_len}: "
                             "a prompt's prefill runs in one forward")
        self.gpu = get_gpu()
        self.kernels = Kernels(self.gpu)
        self.weights = load_weights(self.checkpoint, self.gpu, progress=progress)
        self.model = Model(self.weights, self.config, self.gpu, self.kernels, max_batch_size, self.max_model_len,
                           tokens)
        self.pad_token_id = 0                              # what padding rows feed; it never changes a result
        self.timings: list[Timing] = []                    # one per request of the last generate()
        self.stats = BatchStats()                          # the last generate()'s batches, steps and waste

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
        seq = self._sequence(0, self.prompts.encode(list(token_ids)), SamplingParams(temperature=0.0))
        step = self._batch([seq]).prefill_groups(self.model.max_rows, self.model.score_capacity)[0]
        step.logit_rows = np.arange(step.num_rows, dtype=np.int32)
        out = self.gpu.empty((step.num_rows, self.config.vocab_size), "f32")
        self.model.forward(step, out)
        return self.gpu.to_host(out)

    def decode_logits(self, sequences, n_prompts) -> list[np.ndarray]:
        """Prefill sequences[b][:n_prompts[b]] as one batch, then decode the rest of each teacher-forced (its
        given tokens, not sampled ones); per sequence, the logits (len - n_prompt + 1, V) f32 that chose each
        following token (for tests against a full recompute)."""
        seqs = [self._sequence(b, self.prompts.encode(list(s[:n])),
                               SamplingParams(max_tokens=len(s) - n + 1, temperature=0.0, ignore_eos=True))
                for b, (s, n) in enumerate(zip(sequences, n_prompts))]
        per_seq: list[list[np.ndarray]] = [[] for _ in seqs]   # each sequence's logits, step by step

        def forced(n: int) -> list[int]:
            logits = self.gpu.to_host(self.model.row_view(self.model.logits, 0, n))
            for b, s in enumerate(seqs):
                if s.running:
                    per_seq[b].append(logits[b])
            return [sequences[b][s.length] if s.length < len(sequences[b]) else 0 for b, s in enumerate(seqs)]

        for _ in self._run_batch(self._batch(seqs), forced):
            pass
        return [np.stack(steps) for steps in per_seq]

    def generate(self, prompts, params: SamplingParams | list[SamplingParams]) -> list[RequestOutput]:
        """Run every prompt (text or token ids) to completion, in static batches of up to max_batch_size;
        the outputs come back in the order of the prompts."""
        requests = self.prompts.requests(prompts, params)
        self.stats = BatchStats()
        # every request's clock starts now: time spent waiting for an earlier batch counts as its user sees it
        seqs = [self._sequence(rid, ids, p) for rid, (ids, p) in enumerate(requests)]
        self.timings = [s.timing for s in seqs]
        for batch in plan_batches(len(seqs), self.max_batch_size):
            for _ in self._run_batch(self._batch([seqs[i] for i in batch])):
                pass
        return [RequestOutput(s.request_id, s.prompt, s.new, self.tokenizer.decode(s.new), s.finish_reason)
                for s in seqs]

    def stream(self, prompt, params: SamplingParams):
        """Yield (token id, finish reason or None) as each new token is chosen: a batch of one."""
        self.stats = BatchStats()
        seq = self._sequence(0, self.prompts.encode(prompt), params)
        self.timings = [seq.timing]
        for _ in self._run_batch(self._batch([seq])):
            yield seq.new[-1], seq.finish_reason

    def _sequence(self, request_id: int, ids: list[int], params: SamplingParams) -> Sequence:
        seed = params.seed if params.seed is not None else secrets.randbits(64)
        return Sequence(request_id, ids, params, self.prompts.stop_ids(params), seed, Timing(len(ids)))

    def _finish_reason(self, s: Sequence) -> str | None:
        return self.prompts.finish_reason(s.new, s.length, s.params, s.stop)

    def _batch(self, seqs: list[Sequence]) -> StaticBatch:
        return StaticBatch(seqs, self.max_model_len, self.stats, self._finish_reason, self.pad_token_id)

    def _run_batch(self, batch: StaticBatch, choose: Callable[[int], list[int]] | None = None):
        """Prefill the batch, then decode until every sequence has finished; yields after each step's tokens
        are recorded. `choose(B)` picks the step's tokens from self.model.logits (default: the sampler)."""
        choose = choose or self.model.sample
        self.model.set_sampling(batch.seqs)
        for step in batch.prefill_groups(self.model.max_rows, self.model.score_capacity):
            self.model.forward(step)
        while True:
            batch.record(choose(len(batch)))                      # waits for the GPU
            yield
            if batch.done:
                return
            self.model.forward(batch.decode_inputs())
