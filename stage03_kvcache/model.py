"""The Llama forward pass on the GPU, over new tokens only: earlier positions live in the KV cache.

forward(pos0, T) runs the T tokens at positions pos0 .. pos0 + T - 1: prefill is forward(0, prompt length),
a decode step is forward(p, 1), whose GEMMs have M = 1 row.

    x = embed(ids[pos0 : pos0 + T])                                         (T, H)    the residual stream
    for each layer:
        h = rms_norm(x) * w_in                  [add_rms_norm fuses the previous layer's  x += d]
        q, k, v = h @ Wqkv^T                    (T, (nh + 2 nkv) hd)   one GEMM: q/k/v weights adjacent
        q, k = rope(q, k, positions pos0..)
        K[pos0:], V[pos0:] = k, v                                      append to the layer's cache
        a = causal_gqa_attention(q, K[:pos0 + T], V[:pos0 + T])        (T, nh hd)
        d = a @ Wo^T;            x += d;  h = rms_norm(x) * w_post       (one fused kernel)
        g, u = h @ Wgate_up^T   (T, 2 I)                                 one GEMM: gate/up adjacent
        d = (silu(g) * u) @ Wdown^T
    x += d;  h = rms_norm(x) * w_final;  logits = h @ E^T   (the LM head is the embedding, tied)

Buffer reuse: every activation buffer is allocated once, for max_model_len tokens, and each forward uses its
first T rows; the layers take turns in the same buffers. No allocation happens while generating.
"""
from __future__ import annotations

import numpy as np

from common.config import LlamaConfig
from common.cublas import Cublas
from common.device import DeviceArray, Gpu
from common.rope import rope_cos_sin

from .cache import KVCache
from .kernels import Kernels
from .weights import GpuWeights


class Model:
    def __init__(self, weights: GpuWeights, config: LlamaConfig, gpu: Gpu, kernels: Kernels, max_model_len: int):
        self.weights, self.config, self.gpu, self.kernels = weights, config, gpu, kernels
        self.cublas = Cublas(gpu)
        self.max_model_len = L = max_model_len
        c = config
        nh, nkv, hd, H, inter = (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size,
                                 c.intermediate_size)
        self.qkv_width = (nh + 2 * nkv) * hd
        # ---- every activation, allocated once for L tokens (shapes per token row)
        self.ids = gpu.empty((L,), "i32")                   # the sequence so far; the sampler appends to it
        self.x = gpu.empty((L, H), "bf16")                  # residual stream
        self.h = gpu.empty((L, H), "bf16")                  # normed input of the next GEMM
        self.qkv = gpu.empty((L, self.qkv_width), "bf16")
        self.attn = gpu.empty((L, nh * hd), "bf16")
        self.d = gpu.empty((L, H), "bf16")                  # a sublayer's output, added into x by the next norm
        self.gate_up = gpu.empty((L, 2 * inter), "bf16")
        self.act = gpu.empty((L, inter), "bf16")
        self.scores = gpu.empty((nh * L * L,), "f32")       # attention probabilities, (nh, T, T) for T <= L
        self.logits = gpu.empty((1, c.vocab_size), "f32")   # the last position's, for sampling
        cos, sin = rope_cos_sin(c, np.arange(L))            # (L, hd/2) each, fp32
        self.cos, self.sin = gpu.to_device(cos), gpu.to_device(sin)
        self.layers = [self._layer_weights(i) for i in range(c.num_hidden_layers)]
        self.cache = KVCache(c, L, gpu)

    def _layer_weights(self, i: int) -> dict[str, DeviceArray]:
        w, p = self.weights, f"model.layers.{i}."
        return {"in_norm": w[p + "input_layernorm.weight"], "qkv": w.fused(i, "qkv"),
                "o": w[p + "self_attn.o_proj.weight"], "post_norm": w[p + "post_attention_layernorm.weight"],
                "gate_up": w.fused(i, "gate_up"), "down": w[p + "mlp.down_proj.weight"]}

    @staticmethod
    def row_view(buf: DeviceArray, first: int, n: int) -> DeviceArray:
        """Rows [first, first + n) of a (L, C) buffer, as an (n, C) array."""
        cols = buf.shape[1]
        return buf.view(first * cols * (buf.nbytes // buf.size), (n, cols))

    def forward(self, pos0: int, n_tokens: int, logits: DeviceArray | None = None) -> DeviceArray:
        """Run the tokens self.ids[pos0 : pos0 + n_tokens] at their positions, appending their K/V to the cache;
        return the last one's logits (1, V) f32, or, when `logits` (n_tokens, V) f32 is given, every one's into
        it. Queues GPU work; does not wait."""
        c, k, T = self.config, self.kernels, n_tokens
        self.cache.reserve(pos0, T)                                 # refuses a write past max_model_len
        nh, nkv, hd, eps = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps
        view = self.row_view
        x, h, d = view(self.x, 0, T), view(self.h, 0, T), view(self.d, 0, T)
        qkv, attn = view(self.qkv, 0, T), view(self.attn, 0, T)
        gate_up, act = view(self.gate_up, 0, T), view(self.act, 0, T)
        k.embedding(self.ids.view(4 * pos0, (T,)), self.weights["model.embed_tokens.weight"], x)
        for i, w in enumerate(self.layers):
            if i == 0:
                k.rms_norm(x, w["in_norm"], h, eps)
            else:
                k.add_rms_norm(x, d, w["in_norm"], h, eps)        # x += previous layer's MLP output
            self.cublas.linear(h, w["qkv"], qkv)
            k.rope(qkv, self.cos, self.sin, pos0, nh + nkv, hd)
            k_cache, v_cache = self.cache.layer(i)
            k.kv_write(qkv, k_cache, v_cache, pos0, nh, nkv, hd)
            k.attention(qkv, k_cache, v_cache, self.scores, attn, pos0, nh, nkv, hd)
            self.cublas.linear(attn, w["o"], d)
            k.add_rms_norm(x, d, w["post_norm"], h, eps)          # x += attention output
            self.cublas.linear(h, w["gate_up"], gate_up)
            k.silu_mul(gate_up, act)
            self.cublas.linear(act, w["down"], d)
        k.add_rms_norm(x, d, self.weights["model.norm.weight"], h, eps)
        if logits is None:
            logits = self.logits
            h = view(self.h, T - 1, 1)                              # only the last position is sampled
        self.cublas.linear(h, self.weights.lm_head, logits)
        return logits
