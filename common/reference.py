"""The numpy reference: a float32 Llama forward, written for clarity, and an engine with the stage API on top.

Every stage is checked against this; this is checked against Hugging Face transformers (tests/test_reference_hf.py).
Notation: T tokens, H hidden, nh query heads, nkv key/value heads, hd head_dim, V vocab.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from common.checkpoint import Checkpoint
from common.outputs import RequestOutput, Timing, drain
from common.prompts import PromptPreparer
from common.rope import rope_cos_sin, rope_inv_freq  # noqa: F401  (re-exported: the reference's RoPE)
from common.sampling import SamplingParams


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate pairs (x_i, x_{i+hd/2}) by angle pos*theta_i (Hugging Face's rotate-half layout)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]                               # (T, n, hd/2) each
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


class ReferenceModel:
    """float32 weights (widened from the file's bf16) and the forward pass."""

    def __init__(self, checkpoint: Checkpoint):
        self.config = cfg = checkpoint.config
        self.w = {name: checkpoint.f32(name) for name in checkpoint.entries}
        self.lm_head = self.w["model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"]

    def hidden(self, token_ids, kv: list | None = None) -> np.ndarray:
        """Final-normed hidden states (T, H) of a whole sequence, positions 0..T-1. With a list `kv`, each
        layer's (k after RoPE, v), shapes (T, nkv, hd), are appended to it: what a KV cache must hold."""
        cfg, w = self.config, self.w
        ids = np.asarray(token_ids, dtype=np.int64)
        T, nh, nkv, hd = len(ids), cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        cos, sin = rope_cos_sin(cfg, np.arange(T))
        causal = np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)  # (T, T): -inf above the diagonal
        x = w["model.embed_tokens.weight"][ids]                            # (T, H)
        for layer in range(cfg.num_hidden_layers):
            p = f"model.layers.{layer}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
            q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            if kv is not None:
                kv.append((k, v))
            group = nh // nkv                                              # query heads per KV head (GQA)
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # (T, nh, hd)
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + causal  # (nh, T, T)
            attn = np.einsum("hqk,khd->qhd", softmax(scores), v).reshape(T, nh * hd)
            x = x + attn @ w[p + "self_attn.o_proj.weight"].T
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            x = x + (silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        return rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps)

    def forward(self, token_ids) -> np.ndarray:
        """Logits (T, V) float32 at every position."""
        return self.hidden(token_ids) @ self.lm_head.T

    def last_logits(self, token_ids) -> np.ndarray:
        return self.lm_head @ self.hidden(token_ids)[-1]                   # (V,): a contiguous matvec


def sample_reference(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Greedy, or temperature, then top-k, then top-p of the tokens top-k kept (vLLM's order; the definitions the GPU
    sampler is tested against)."""
    if params.greedy:
        return int(np.argmax(logits))
    probs = softmax(logits.astype(np.float64) / params.temperature)
    if params.top_k in (0, -1) and params.top_p >= 1.0:     # every token kept: no order needed (a sort of the
        return int(rng.choice(len(probs), p=probs))          # 128K-token vocabulary was 80% of a CPU step)
    order = np.argsort(-probs, kind="stable")
    keep = len(order) if params.top_k in (0, -1) else min(params.top_k, len(order))
    cum = np.cumsum(probs[order[:keep]])
    keep = min(keep, int(np.searchsorted(cum, params.top_p * cum[-1])) + 1)   # top_p of what top_k kept (vLLM)
    kept = order[:keep]
    return int(rng.choice(kept, p=probs[kept] / probs[kept].sum()))


@dataclass(eq=False)
class _Request:
    """A request the step API holds: its tokens so far, its generator, its clock and its text stream."""

    request_id: int | str
    prompt: list[int]
    params: SamplingParams
    stop: frozenset[int]
    rng: np.random.Generator
    timing: Timing
    text: object                                   # the tokenizer's DetokenizeStream (None: token ids only)
    new: list[int] = field(default_factory=list)


class ReferenceEngine:
    """The stage API on the numpy model, no cache: each step re-runs the whole sequence. Slow, obviously right.

    Also the step API a server drives (vLLM's LLMEngine shape), so that common.serve runs on any machine:
    add_request() validates and queues; step() gives every running request one token (admitting waiting ones,
    first come first served, up to max_num_seqs) and returns a RequestOutput for each; abort_request() drops a
    request at once (an unknown or finished id is a no-op)."""

    def __init__(self, model: str, max_model_len: int | None = None, max_num_seqs: int = 8):
        from common.synthetic import resolve_model

        folder = resolve_model(model)
        self.checkpoint = Checkpoint(folder)
        self.config = self.checkpoint.config
        self.model = ReferenceModel(self.checkpoint)
        self.prompts = PromptPreparer(folder, self.checkpoint.config, max_model_len)
        self.max_model_len = self.prompts.max_model_len
        self.timings: list[Timing] = []                    # one per request of the last generate()
        if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs!r} must be an integer >= 1")
        self.max_num_seqs = max_num_seqs
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._next_id = itertools.count()

    def generate(self, prompts, params: SamplingParams | list[SamplingParams]) -> list[RequestOutput]:
        requests = self.prompts.requests(prompts, params)
        self.timings = []
        return [drain(rid, ids, self.stream(ids, p), self.prompts.tokenizer)
                for rid, (ids, p) in enumerate(requests)]

    def stream(self, prompt, params: SamplingParams):
        """Yield (token id, finish reason or None) as each new token is chosen; records a Timing."""
        timing = Timing(0)
        seq = self.prompts.encode(prompt)
        timing.prompt_tokens = len(seq)
        self.timings.append(timing)
        rng = np.random.default_rng(params.seed)
        stop = self.prompts.stop_ids(params)
        new, reason = [], None
        while reason is None:
            tok = sample_reference(self.model.last_logits(seq), params, rng)
            timing.tick()
            seq.append(tok)
            new.append(tok)
            reason = self.prompts.finish_reason(new, len(seq), params, stop)
            yield tok, reason


    # ------------------------------------------------------------------ the step API
    def add_request(self, prompt, params: SamplingParams, request_id: int | str | None = None,
                    detokenize: bool = True) -> int | str:
        """Validate and queue one request; returns its id. A bad prompt, params or id raises here, and nothing
        is queued. detokenize=False: its outputs carry token ids and no text (the caller detokenises)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, not {type(params).__name__}")
        ids = self.prompts.encode(prompt)
        if request_id is None:
            request_id = f"req-{next(self._next_id)}"
        if any(r.request_id == request_id for r in (*self._waiting, *self._running)):
            raise ValueError(f"request_id {request_id!r} is already in use")
        self._waiting.append(_Request(request_id, ids, params, self.prompts.stop_ids(params),
                                      np.random.default_rng(params.seed), Timing(len(ids)),
                                      self.prompts.tokenizer.stream() if detokenize else None))
        return request_id

    def has_unfinished_requests(self) -> bool:
        return bool(self._waiting or self._running)

    def num_requests(self) -> tuple[int, int]:
        """(running, waiting)."""
        return len(self._running), len(self._waiting)

    def kv_cache_usage(self) -> float:
        """The share of the cache that running requests hold (here: one of max_num_seqs slots each)."""
        return len(self._running) / self.max_num_seqs

    def abort_request(self, request_id) -> None:
        for queue in (self._waiting, self._running):
            for r in list(queue):
                if r.request_id == request_id:
                    queue.remove(r)

    def step(self) -> list[RequestOutput]:
        """One token for every running request (after admitting waiting ones); a RequestOutput for each."""
        while self._waiting and len(self._running) < self.max_num_seqs:
            self._running.append(self._waiting.popleft())
        outs = []
        for r in list(self._running):
            seq = r.prompt + r.new
            tok = sample_reference(self.model.last_logits(seq), r.params, r.rng)
            r.timing.tick()
            r.new.append(tok)
            delta = r.text.step(tok) if r.text else ""
            reason = self.prompts.finish_reason(r.new, len(seq) + 1, r.params, r.stop)
            if reason is not None:   # the last delta flushes what the stream held back (a partial character)
                self._running.remove(r)
                delta += r.text.finish(r.new) if r.text else ""
            outs.append(RequestOutput(r.request_id, r.prompt, list(r.new), r.text.text if r.text else "", reason,
                                      [tok], delta))
        return outs


Engine = ReferenceEngine   # the name the benchmark harness loads (`python -m common.bench --stages numpy,02`)
