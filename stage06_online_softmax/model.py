"""The Llama forward pass on the GPU for a step: R packed rows, each a token of some sequence at some position.

forward(step) runs the rows of a StepInputs (packing.py): decode rows and prompt chunks of any sequences, side
by side, no padding. Every GEMM has M = R rows, so the weights are read once per forward for all the sequences
in it: what batching buys.

    x = embed(tokens)                                                        (R, H)    the residual stream
    for each layer:
        h = rms_norm(x) * w_in                  [add_rms_norm fuses the previous layer's  x += d]
        q, k, v = h @ Wqkv^T                    (R, (nh + 2 nkv) hd)   one GEMM: q/k/v weights adjacent
        q, k = rope(q, k, positions)                                   each row at its own position
        K[slot_mapping], V[slot_mapping] = k, v                        each row's cache slot; -1 = skip
        a = causal_gqa_attention(q, K[seq_slot], V[seq_slot], keys 0..position)  (R, nh hd)  online softmax,
                 no score matrix, on tensor cores: prompt chunks a tile of rows a block, decode rows a
                 block each with their keys split over blocks (flash-decoding)
        d = a @ Wo^T;            x += d;  h = rms_norm(x) * w_post       (one fused kernel)
        g, u = h @ Wgate_up^T   (R, 2 I)                                 one GEMM: gate/up adjacent
        d = (silu(g) * u) @ Wdown^T
    x += d;  h = rms_norm(x) * w_final;  logits = h[logit_rows] @ E^T   (the LM head is the embedding, tied)

Buffer reuse: every activation buffer is allocated once, for max_num_batched_tokens rows, and each forward uses
its first R rows; the layers take turns in the same buffers. No allocation happens while generating.
activation_bytes() is their size, which the engine subtracts before it sizes the KV cache from what is left.
"""
from __future__ import annotations

import numpy as np

from common.config import LlamaConfig
from common.cublas import Cublas
from common.device import DeviceArray, Gpu
from common.rope import rope_cos_sin

from .cache import KVCache
from .kernels import ATTENTION_MAX_GROUP, Kernels, decode_split, tile_rows
from .packing import StepInputs, plan_attention
from .weights import GpuWeights

PARTIAL_ROWS_PER_SEQ = 4   # flash-decoding's partials hold 4 (row, split) pairs per seq_slot: enough splits where
#                            few rows are decoding, which is where splits are needed


def activation_bytes(config: LlamaConfig, max_num_seqs: int, max_model_len: int, max_num_batched_tokens: int) -> int:
    """What Model allocates besides the KV cache: R rows of activations, B rows of logits, the step inputs, the
    sampling parameters, RoPE's tables and flash-decoding's partials. No score scratch: the online softmax keeps
    its scores on chip, so nothing here grows with max_model_len but RoPE's tables."""
    c, R, B, L = config, max_num_batched_tokens, max_num_seqs, max_model_len
    per_row = 2 * (3 * c.hidden_size + (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
                   + c.num_attention_heads * c.head_dim + 3 * c.intermediate_size)     # bf16 x h d qkv attn gate_up act
    partials = 4 * PARTIAL_ROWS_PER_SEQ * B * c.num_attention_heads * (c.head_dim + 2)
    return (R * per_row + 4 * B * c.vocab_size + 4 * (10 * R + B) + 20 * B + 2 * 4 * L * (c.head_dim // 2)
            + partials)


class Model:
    def __init__(self, weights: GpuWeights, config: LlamaConfig, gpu: Gpu, kernels: Kernels, max_num_seqs: int,
                 max_model_len: int, max_num_batched_tokens: int):
        self.weights, self.config, self.gpu, self.kernels = weights, config, gpu, kernels
        self.cublas = Cublas(gpu)
        self.max_num_seqs, self.max_model_len = B, L = max_num_seqs, max_model_len
        self.max_rows = R = max_num_batched_tokens
        c = config
        nh, nkv, hd, H, inter = (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size,
                                 c.intermediate_size)
        self.qkv_width = (nh + 2 * nkv) * hd
        if nh // nkv > ATTENTION_MAX_GROUP or hd > 256:
            raise ValueError(f"num_attention_heads / num_key_value_heads = {nh // nkv} and head_dim = {hd}: this "
                             f"stage's attention holds at most {ATTENTION_MAX_GROUP} query heads per key/value head "
                             "and head_dim up to 256")
        self.cache = KVCache(c, B, L, gpu)                  # first: the one allocation that grows with B x L
        # ---- every activation, allocated once for R rows (shapes per row)
        self.inputs = gpu.empty((10 * R,), "i32")           # one step's tokens | positions | slot_mapping (R
        #               each) | logit rows | their seq_slots | counters (n <= R each) | prompt tiles | decode
        #               tiles (4 numbers each, <= R tiles in all), in one copy (attention reads seq_slots there)
        self.tile_rows = tile_rows(nh, nkv, hd)             # 0: this head_dim takes every row alone
        self.partial_rows = PARTIAL_ROWS_PER_SEQ * B        # flash-decoding's (decode tile, split) pairs, at most
        self.partial = gpu.empty((self.partial_rows * nh * (hd + 2),), "f32")
        self.x = gpu.empty((R, H), "bf16")                  # residual stream
        self.h = gpu.empty((R, H), "bf16")                  # normed input of the next GEMM
        self.qkv = gpu.empty((R, self.qkv_width), "bf16")
        self.attn = gpu.empty((R, nh * hd), "bf16")
        self.d = gpu.empty((R, H), "bf16")                  # a sublayer's output, added into x by the next norm
        self.gate_up = gpu.empty((R, 2 * inter), "bf16")
        self.act = gpu.empty((R, inter), "bf16")
        self.logits = gpu.empty((B, c.vocab_size), "f32")   # the logit rows of a step, for sampling
        self.next_ids = gpu.empty((B,), "i32")              # the sampler's choices
        # every seq_slot's sampling parameters, written at admission: seed u64 | temperature f32 | top_k i32 |
        # top_p f32
        self.sampling = gpu.empty((20 * B,), "u8")
        self._sampling_host = np.zeros(20 * B, np.uint8)   # its host mirror: one seq_slot is rewritten at a time
        self.seed, self.temperature = self.sampling.view(0, (B,), "u64"), self.sampling.view(8 * B, (B,), "f32")
        self.top_k, self.top_p = self.sampling.view(12 * B, (B,), "i32"), self.sampling.view(16 * B, (B,), "f32")
        self.counters = self.logit_seq_slots = self.inputs.view(0, (B,))   # set by each forward's upload
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

    def set_params(self, seq_slot: int, params, seed: int) -> None:
        """One sequence's sampling parameters into its seq_slot, written when it is admitted (the other
        seq_slots keep theirs)."""
        B, host = self.max_num_seqs, self._sampling_host
        host[8 * seq_slot:8 * seq_slot + 8].view(np.uint64)[0] = seed
        host[8 * B + 4 * seq_slot:8 * B + 4 * seq_slot + 4].view(np.float32)[0] = params.temperature
        host[12 * B + 4 * seq_slot:12 * B + 4 * seq_slot + 4].view(np.int32)[0] = params.top_k
        host[16 * B + 4 * seq_slot:16 * B + 4 * seq_slot + 4].view(np.float32)[0] = params.top_p
        self.copy_in(self.sampling, host)

    def upload_step(self, step: StepInputs, logits: DeviceArray | None = None) -> tuple[DeviceArray, ...]:
        """Queue the copy of a step's inputs to the GPU (one copy); returns the device views that run_uploaded()
        reads: tokens, positions, slot_mapping, logit_rows and attention's plan (prompt tiles,
        decode tiles, the decode tiles' split). Waits for earlier GPU work first (the staging buffer is
        reused)."""
        R, n = step.num_rows, len(step.logit_rows)
        if n > self.max_num_seqs and logits is None:
            raise ValueError(f"{n} logit rows: the engine's logits hold {self.max_num_seqs}")
        if not 0 < R <= self.max_rows:
            raise ValueError(f"a forward of {R} rows: the engine holds 1..{self.max_rows}")
        for name, slots in (("seq_slots", step.seq_slots), ("logit_seq_slots", step.logit_seq_slots)):
            if len(slots) and (slots.min() < 0 or slots.max() >= self.max_num_seqs):   # the kernels cannot
                raise ValueError(f"{name} {slots.min()}..{slots.max()} outside the {self.max_num_seqs} the "
                                 "engine holds")
        prompt, decode = plan_attention(step.spans, self.tile_rows)
        split = (decode_split(len(decode), int(decode[:, 3].max()) + 1, self.config.num_key_value_heads,
                              self.kernels.sms, self.partial_rows) if len(decode) else None)
        self.copy_in(self.inputs, np.concatenate([step.tokens, step.positions, step.slot_mapping, step.logit_rows,
                                                  step.logit_seq_slots, step.counters, prompt.reshape(-1),
                                                  decode.reshape(-1)]).astype(np.int32))
        at, np_, nd = self.inputs.view, len(prompt), len(decode)
        self.logit_seq_slots = at(4 * (3 * R + n), (n,))
        self.counters = at(4 * (3 * R + 2 * n), (n,))
        end = 4 * (3 * R + 3 * n)
        return (at(0, (R,)), at(4 * R, (R,)), at(8 * R, (R,)), at(12 * R, (n,)),
                at(end, (np_, 4)) if np_ else None, at(end + 16 * np_, (nd, 4)) if nd else None, split)

    def forward(self, step: StepInputs, logits: DeviceArray | None = None) -> DeviceArray:
        """Upload the step's inputs and run it (see run_uploaded())."""
        return self.run_uploaded(step, self.upload_step(step, logits), logits)

    def run_uploaded(self, step: StepInputs, inputs, logits: DeviceArray | None = None) -> DeviceArray:
        """Run the rows of `step` from its uploaded `inputs`, writing their K/V into the cache; the logits of
        step.logit_rows go to rows 0..n-1 of self.logits (B, V) f32 (at most one per sequence), or into `logits`
        (n, V) f32 when given. Queues GPU work; does not wait."""
        c, k, R = self.config, self.kernels, step.num_rows
        tokens, positions, slot_mapping, logit_rows, prompt_tiles, decode_tiles, split = inputs
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
            if prompt_tiles is not None:
                k.attention(qkv, k_cache, v_cache, attn, self.partial, prompt_tiles, nh, nkv, hd)
            if decode_tiles is not None:
                k.attention(qkv, k_cache, v_cache, attn, self.partial, decode_tiles, nh, nkv, hd, *split)
            self.cublas.linear(attn, w["o"], d)
            k.add_rms_norm(x, d, w["post_norm"], h, eps)          # x += attention output
            self.cublas.linear(h, w["gate_up"], gate_up)
            k.silu_mul(gate_up, act)
            self.cublas.linear(act, w["down"], d)
        k.add_rms_norm(x, d, self.weights["model.norm.weight"], h, eps)
        n = len(step.logit_rows)
        if n == 0:                                   # a step of prompt chunks that complete no prompt
            return self.row_view(self.logits, 0, 0)
        chosen = view(self.d, 0, n)                  # d is free again: it takes the rows whose logits are wanted
        k.embedding(logit_rows, h, chosen)           # a row gather, which is what the embedding kernel does
        if logits is None:                           # (n, V) of the (B, V) buffer, or the caller's
            logits = self.row_view(self.logits, 0, n)
        self.cublas.linear(chosen, self.weights.lm_head, logits)
        return logits

    def queue_sample_rows(self, n: int) -> DeviceArray:
        """Queue the sampler over the first n logits rows of a packed step, row i with the parameters of the
        seq_slot the last upload gave it (logit_seq_slots) and its counter; returns the (n,) i32 it writes."""
        out = self.next_ids.view(0, (n,))
        self.kernels.sample(self.row_view(self.logits, 0, n), self.temperature, self.top_k, self.top_p, self.seed,
                            self.logit_seq_slots, self.counters, out)
        return out
