"""The engine: continuous batching. Requests join and leave the running set at every step.

    add_request(prompt, params) -> id     queued at once (WAITING)
    step():   the scheduler plans one forward: a decode row for every running sequence, then prompt chunks
              (of running sequences still prefilling, then of newly admitted ones) within the token budget;
              the rows are packed with no padding, run, and each sampled with its own seq_slot's parameters
              a finished sequence frees its seq_slot at once; the next step gives it to a waiting request
    generate() / stream()                 built on the two, as every stage's

The KV cache is still one contiguous region of max_model_len positions per seq_slot (stage07 pages it), but how
many seq_slots there are is now sized from the GPU's memory, as vLLM sizes its cache (cache.plan_num_seqs).
The loop is llm_engine.py; the GPU under it is runner.py over model.py.
"""
from __future__ import annotations

import sys

import numpy as np

from common.checkpoint import Checkpoint
from common.device import DeviceArray, get_gpu
from common.outputs import RequestOutput
from common.prompts import PromptPreparer
from common.sampling import SamplingParams
from common.synthetic import resolve_model

from .cache import MAX_NUM_SEQS, check_count, kv_cache_bytes, plan_num_seqs
from .kernels import Kernels
from .llm_engine import LLMEngine
from .model import Model, activation_bytes
from .packing import StepInputs
from .runner import GpuRunner
from .weights import load_weights, verify

MAX_NUM_BATCHED_TOKENS = 2048      # rows per forward, the token budget. The 1B's GEMMs are compute-bound well
#                                    before it; a larger budget costs activation rows (attention has no scratch
#                                    any more) and lengthens the steps that carry prompt chunks


class Engine:
    def __init__(self, model: str, max_model_len: int | None = None, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None, gpu_memory_utilization: float = 0.9,
                 progress: bool = False):
        self.folder = resolve_model(model)
        self.checkpoint = Checkpoint(self.folder)          # every validation error is raised here, before the GPU
        self.config = self.checkpoint.config
        self.prompts = PromptPreparer(self.folder, self.config, max_model_len)
        self.tokenizer = self.prompts.tokenizer
        self.max_model_len = L = self.prompts.max_model_len
        if max_num_seqs is not None:
            check_count("max_num_seqs", max_num_seqs)
        tokens = check_count("max_num_batched_tokens", max(MAX_NUM_BATCHED_TOKENS, max_num_seqs or MAX_NUM_SEQS)
                             if max_num_batched_tokens is None else max_num_batched_tokens)
        self.gpu = get_gpu()
        self.kernels = Kernels(self.gpu)
        self.weights = load_weights(self.checkpoint, self.gpu, progress=progress)
        free, total = self.gpu.memory()
        activations = activation_bytes(self.config, max_num_seqs or MAX_NUM_SEQS, L, tokens)
        self.max_num_seqs = B = plan_num_seqs(self.config, L, total, total - free, activations,
                                              gpu_memory_utilization, max_num_seqs)
        if tokens < B:
            raise ValueError(f"max_num_batched_tokens={tokens} must be >= max_num_seqs={B}: each running "
                             "sequence decodes one row per step")
        print(f"kv cache   {B} seq_slots x {L} positions = {kv_cache_bytes(self.config, L, B) / 2**30:.2f} GiB "
              f"(activations {activations / 2**30:.2f} GiB, token budget {tokens} rows a step)", file=sys.stderr)
        self.model = Model(self.weights, self.config, self.gpu, self.kernels, B, L, tokens)
        self.llm = LLMEngine(GpuRunner(self.model), self.prompts, B, tokens)

    # ------------------------------------------------------------------ the step API (llm_engine.py)
    def add_request(self, prompt, params: SamplingParams, request_id=None, detokenize: bool = True):
        return self.llm.add_request(prompt, params, request_id, detokenize)

    def step(self) -> list[RequestOutput]:
        return self.llm.step()

    def abort_request(self, request_id) -> None:
        self.llm.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.llm.has_unfinished_requests()

    def num_requests(self) -> tuple[int, int]:
        return self.llm.num_requests()

    def kv_cache_usage(self) -> float:
        return self.llm.kv_cache_usage()

    def generate(self, prompts, params: SamplingParams | list[SamplingParams]) -> list[RequestOutput]:
        """Run every prompt (text or token ids) to completion; the outputs come back in the order of the
        prompts. The counters in `stats` and the `timings` are this call's."""
        return self.llm.generate(prompts, params)

    def stream(self, prompt, params: SamplingParams):
        """Yield (token id, finish reason or None) as each new token of one request is chosen."""
        return self.llm.stream(prompt, params)

    @property
    def timings(self):
        return self.llm.timings

    @property
    def stats(self):
        return self.llm.scheduler.stats

    # ------------------------------------------------------------------ for tests and comparisons
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

    def logits(self, token_ids, chunk: int | None = None) -> np.ndarray:
        """Logits (T, V) float32 at every position of one sequence, prefilled into seq_slot 0 in chunks of
        `chunk` rows (default: the token budget), each chunk over the keys the ones before it cached."""
        self._require_idle()
        ids = np.asarray(self.prompts.encode(list(token_ids)), np.int32)
        chunk = chunk or self.model.max_rows
        out = self.gpu.empty((len(ids), self.config.vocab_size), "f32")
        for first in range(0, len(ids), chunk):
            pos = np.arange(first, min(first + chunk, len(ids)), dtype=np.int32)
            zeros = np.zeros(len(pos), np.int32)
            spans = np.array([[0, len(pos), 0, first]], np.int32)              # one chunk, seq_slot 0
            step = StepInputs(ids[pos], pos, pos.copy(), zeros, pos - first, zeros, zeros, spans)
            self.model.forward(step, self.model.row_view(out, first, len(pos)))
        return self.gpu.to_host(out)

    def decode_logits(self, sequences, n_prompts) -> list[np.ndarray]:
        """Run sequences[b][:n_prompts[b]] as requests together, then decode the rest of each teacher-forced
        (its given tokens, not sampled ones); per sequence, the logits (len - n_prompt + 1, V) f32 that chose
        each following token (for tests against a full recompute)."""
        self._require_idle()
        forced = _TeacherForced(self.model, sequences)
        loop = LLMEngine(forced, self.prompts, self.max_num_seqs, self.model.max_rows)
        forced.loop = loop
        ids = [loop.add_request(list(s[:n]), SamplingParams(max_tokens=len(s) - n + 1, temperature=0.0,
                                                            ignore_eos=True), request_id=b)
               for b, (s, n) in enumerate(zip(sequences, n_prompts))]
        while loop.has_unfinished_requests():
            loop.step()
        self.llm.scheduler.stats = loop.scheduler.stats
        return [np.stack(forced.logits[i]) for i in ids]

    def _require_idle(self) -> None:
        if self.llm.has_unfinished_requests():   # these write seq_slots a running request may hold
            raise RuntimeError("logits() and decode_logits() need an engine with no unfinished requests")


class _TeacherForced(GpuRunner):
    """A runner that keeps each logit row's logits and feeds the sequence's given next token, not a sampled one."""

    def __init__(self, model: Model, sequences):
        super().__init__(model)
        self.sequences, self.loop, self.logits = sequences, None, {b: [] for b in range(len(sequences))}

    def admit(self, seq) -> None:
        pass                                        # nothing is sampled

    def run(self, x: StepInputs) -> np.ndarray:
        self.model.forward(x)
        n = len(x.logit_rows)
        logits = self.model.gpu.to_host(self.model.row_view(self.model.logits, 0, n)) if n else []
        by_slot = {s.seq_slot: s for s in self.loop.scheduler.running}
        chosen = []
        for row, slot in zip(logits, x.logit_seq_slots):
            s = by_slot[int(slot)]
            self.logits[s.request_id].append(row)
            given = self.sequences[s.request_id]
            chosen.append(given[s.length] if s.length < len(given) else 0)
        return np.array(chosen, np.int32)
