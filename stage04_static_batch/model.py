"""The Llama forward pass on the GPU for a batch: R rows of tokens, each of some sequence at some position.

forward(step) runs the rows of a StepInputs (batch.py): a prefill group is rows_per_seq = the group's padded
prompt length rows per sequence, a decode step one row per sequence of the batch. Every GEMM has M = R rows,
so the weights are read once per forward for all the sequences in it: what batching buys.

    x = embed(tokens)                                                        (R, H)    the residual stream
    for each layer:
        h = rms_norm(x) * w_in                  [add_rms_norm fuses the previous layer's  x += d]
        q, k, v = h @ Wqkv^T                    (R, (nh + 2 nkv) hd)   one GEMM: q/k/v weights adjacent
        q, k = rope(q, k, positions)                                   each row at its own position
        K[slot_mapping], V[slot_mapping] = k, v                        each row's cache slot; -1 = skip
        a = causal_gqa_attention(q, K[seq], V[seq], keys 0..position)  (R, nh hd)
        d = a @ Wo^T;            x += d;  h = rms_norm(x) * w_post       (one fused kernel)
        g, u = h @ Wgate_up^T   (R, 2 I)                                 one GEMM: gate/up adjacent
        d = (silu(g) * u) @ Wdown^T
    x += d;  h = rms_norm(x) * w_final;  logits = h[logit_rows] @ E^T   (the LM head is the embedding, tied)

Buffer reuse: every activation buffer is allocated once, for max_num_batched_tokens rows, and each forward uses
its first R rows; the layers take turns in the same buffers. No allocation happens while generating.
"""
from __future__ import annotations

import numpy as np

from common.config import LlamaConfig
from common.cublas import Cublas
from common.device import DeviceArray, Gpu
from common.rope import rope_cos_sin

from .batch import StepInputs
from .cache import KVCache
from .kernels import Kernels
from .weights import GpuWeights


class Model:
    def __init__(self, weights: GpuWeights, config: LlamaConfig, gpu: Gpu, kernels: Kernels, max_batch_size: int,
                 max_model_len: int, max_num_batched_tokens: int):
        self.weights, self.config, self.gpu, self.kernels = weights, config, gpu, kernels
        self.cublas = Cublas(gpu)
        self.max_batch_size, self.max_model_len = B, L = max_batch_size, max_model_len
        self.max_rows = R = max_num_batched_tokens
        c = config
        nh, nkv, hd, H, inter = (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size,
                                 c.intermediate_size)
        self.qkv_width = (nh + 2 * nkv) * hd
        self.cache = KVCache(c, B, L, gpu)                  # first: the one allocation that grows with B x L
        # ---- every activation, allocated once for R rows (shapes per row)
        self.inputs = gpu.empty((4 * R + B,), "i32")        # one step's tokens | positions | slot_mapping |
        #                                                     logit rows | counters, uploaded in one copy
        self.x = gpu.empty((R, H), "bf16")                  # residual stream
        self.h = gpu.empty((R, H), "bf16")                  # normed input of the next GEMM
        self.qkv = gpu.empty((R, self.qkv_width), "bf16")
        self.attn = gpu.empty((R, nh * hd), "bf16")
        self.d = gpu.empty((R, H), "bf16")                  # a sublayer's output, added into x by the next norm
        self.gate_up = gpu.empty((R, 2 * inter), "bf16")
        self.act = gpu.empty((R, inter), "bf16")
        # attention probabilities, (nh, rows, keys): per head, one full-length prompt or B decode rows of L keys
        self.score_capacity = L * max(L, B)
        self.scores = gpu.empty((nh * self.score_capacity,), "f32")
        self.logits = gpu.empty((B, c.vocab_size), "f32")   # each sequence's newest, for sampling
        self.next_ids = gpu.empty((B,), "i32")              # the sampler's choices
        # the batch's sampling parameters, one upload per batch: seed u64 | temperature f32 | top_k i32 | top_p f32
        self.sampling = gpu.empty((20 * B,), "u8")
        self.seed, self.temperature = self.sampling.view(0, (B,), "u64"), self.sampling.view(8 * B, (B,), "f32")
        self.top_k, self.top_p = self.sampling.view(12 * B, (B,), "i32"), self.sampling.view(16 * B, (B,), "f32")
        self.counters = self.inputs.view(0, (B,))           # set by each forward's upload
        cos, sin = rope_cos_sin(c, np.arange(L))            # (L, hd/2) each, fp32
        self.cos, self.sin = gpu.to_device(cos), gpu.to_device(sin)
        self.layers = [self._layer_weights(i) for i in range(c.num_hidden_layers)]

    def _layer_weights(self, i: int) -> dict[str, DeviceArray]:
        w, p = self.weights, f"model.layers.{i}."
        return {"in_norm": w[p + "input_layernorm.weight"], "qkv": w.fused(i, "qkv"),
                "o": w[p + "self_attn.o_proj.weight"], "post_norm": w[p + "post_attention_layernorm.weight"],
                "gate_up": w.fused(i, "gate_up"), "down": w[p + "mlp.down_proj.weight"]}

    @staticmethod
    def row_view(buf: DeviceArray, first: int, n: int) -> DeviceArray:
        """Rows [first, first + n) of a (R, C) buffer, as an (n, C) array."""
        cols = buf.shape[1]
        return buf.view(first * cols * (buf.nbytes // buf.size), (n, cols))

    def copy_in(self, dst: DeviceArray, host: np.ndarray) -> None:
        """Copy host bytes into the start of dst, through the pinned staging buffer (queued, not waited for)."""
        stage = self.gpu.staging(host.nbytes)
        self.gpu.sync()                                     # the staging buffer may still feed an earlier copy
        stage.array[: host.nbytes] = host.reshape(-1).view(np.uint8)
        self.gpu.copy_to_device_async(dst.ptr, stage.ptr, host.nbytes)

    def set_sampling(self, seqs) -> None:
        """The batch's per-sequence sampling parameters (batch.Sequence), row b for sequence b."""
        B, n = self.max_batch_size, len(seqs)
        host = np.zeros(20 * B, np.uint8)
        host[:8 * n].view(np.uint64)[:] = [s.seed for s in seqs]
        host[8 * B:8 * B + 4 * n].view(np.float32)[:] = [s.params.temperature for s in seqs]
        host[12 * B:12 * B + 4 * n].view(np.int32)[:] = [s.params.top_k for s in seqs]
        host[16 * B:16 * B + 4 * n].view(np.float32)[:] = [s.params.top_p for s in seqs]
        self.copy_in(self.sampling, host)

    def upload_step(self, step: StepInputs) -> tuple[DeviceArray, DeviceArray, DeviceArray, DeviceArray]:
        """Queue the copy of a step's inputs to the GPU (one copy); returns the device views that run_uploaded()
        reads: tokens, positions, slot_mapping, logit_rows. Waits for earlier GPU work first (the staging buffer
        is reused)."""
        R, n, B = step.num_rows, len(step.logit_rows), len(step.counters)
        if R > self.max_rows or B > self.max_batch_size:
            raise ValueError(f"a forward of {R} rows for a batch of {B}: the engine holds {self.max_rows} rows "
                             f"and {self.max_batch_size} sequences")
        if self.config.num_attention_heads * R * step.max_keys > self.scores.size:
            raise ValueError(f"{R} rows over {step.max_keys} keys exceed the attention scratch")
        self.copy_in(self.inputs, np.concatenate([step.tokens, step.positions, step.slot_mapping, step.logit_rows,
                                                  step.counters]).astype(np.int32))
        at = self.inputs.view
        self.counters = at(4 * (3 * R + n), (B,))
        return at(0, (R,)), at(4 * R, (R,)), at(8 * R, (R,)), at(12 * R, (n,))

    def forward(self, step: StepInputs, logits: DeviceArray | None = None) -> DeviceArray:
        """Upload the step's inputs and run it (see run_uploaded())."""
        return self.run_uploaded(step, self.upload_step(step), logits)

    def run_uploaded(self, step: StepInputs, inputs, logits: DeviceArray | None = None) -> DeviceArray:
        """Run the rows of `step` from its uploaded `inputs`, writing their K/V into the cache; the logits of
        step.logit_rows go to rows first_seq.. of self.logits (B, V) f32, or into `logits` (n, V) f32 when
        given. Queues GPU work; does not wait."""
        c, k, R = self.config, self.kernels, step.num_rows
        tokens, positions, slot_mapping, logit_rows = inputs
        nh, nkv, hd, eps = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps
        view = self.row_view
        x, h, d = view(self.x, 0, R), view(self.h, 0, R), view(self.d, 0, R)
        qkv, attn = view(self.qkv, 0, R), view(self.attn, 0, R)
        gate_up, act = view(self.gate_up, 0, R), view(self.act, 0, R)
        k.embedding(tokens, self.weights["model.embed_tokens.weight"], x)
        for i, w in enumerate(self.layers):
            if i == 0:
                k.rms_norm(x, w["in_norm"], h, eps)
            else:
                k.add_rms_norm(x, d, w["in_norm"], h, eps)        # x += previous layer's MLP output
            self.cublas.linear(h, w["qkv"], qkv)
            k.rope(qkv, self.cos, self.sin, positions, nh + nkv, hd)
            k_cache, v_cache = self.cache.layer(i)
            k.kv_write(qkv, k_cache, v_cache, slot_mapping, nh, nkv, hd)
            k.attention(qkv, k_cache, v_cache, self.scores, attn, positions, step.rows_per_seq, step.first_seq,
                        step.max_keys, nh, nkv, hd)
            self.cublas.linear(attn, w["o"], d)
            k.add_rms_norm(x, d, w["post_norm"], h, eps)          # x += attention output
            self.cublas.linear(h, w["gate_up"], gate_up)
            k.silu_mul(gate_up, act)
            self.cublas.linear(act, w["down"], d)
        k.add_rms_norm(x, d, self.weights["model.norm.weight"], h, eps)
        n = len(step.logit_rows)
        chosen = view(self.d, 0, n)                  # d is free again: it takes the rows whose logits are wanted
        k.embedding(logit_rows, h, chosen)           # a row gather, which is what the embedding kernel does
        if logits is None:                           # (n, V) of the (B, V) buffer, or the caller's
            logits = self.row_view(self.logits, step.first_seq, n)
        self.cublas.linear(chosen, self.weights.lm_head, logits)
        return logits

    def queue_sample(self, n: int) -> DeviceArray:
        """Queue the sampler over the batch's first n logits rows, each with its sequence's parameters and the
        last upload's counters; returns the (n,) i32 device array it writes."""
        first = [a.view(0, (n,)) for a in (self.temperature, self.top_k, self.top_p, self.seed, self.next_ids)]
        self.kernels.sample(self.row_view(self.logits, 0, n), *first[:4], self.counters, first[4])
        return first[4]

    def sample(self, n: int) -> np.ndarray:
        """Each of the batch's n sequences' next token: (n,) int32 on the host (waits for the GPU)."""
        return self.gpu.to_host(self.queue_sample(n))
