"""The numpy reference's forward (common/reference.py), in torch float32 on any device, for the lengths numpy
cannot reach in a test's time: the logits of a prompt's last `keep` positions.

The math is ReferenceModel.hidden's, line for line, with one change of schedule: attention is computed a block of
queries at a time (scores (nh, query_chunk, T) instead of (nh, T, T): 4.3 GB in float32 for 1024 queries over
32768 keys and 32 heads, where the whole matrix would be 137 GB). HF transformers in float32 cannot serve here:
its sdpa falls back to the math kernel at that length (the whole score matrix), and the memory-efficient kernel
refuses grouped K/V heads. CPU-checked against the numpy reference (tests/test_reference_torch.py).
"""
from __future__ import annotations

import numpy as np

from common.checkpoint import Checkpoint
from common.rope import rope_cos_sin


def last_logits(checkpoint: Checkpoint, token_ids, keep: int, device: str = "cuda",
                query_chunk: int = 1024) -> np.ndarray:
    """Logits (keep, V) float32 at positions T - keep .. T - 1 of one sequence (positions 0..T-1)."""
    import torch

    cfg = checkpoint.config
    ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64), device=device)
    T, nh, nkv, hd = len(ids), cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    if not 0 < keep <= T:
        raise ValueError(f"keep={keep} must be in 1..{T} (the prompt's length)")

    def w(name: str):
        return torch.as_tensor(checkpoint.f32(name), device=device)

    def rms_norm(x, weight):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + cfg.rms_norm_eps) * weight

    def rope(x):                                                       # (T, n, hd), rotate-half layout
        half = hd // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    cos, sin = (torch.as_tensor(a, device=device)[:, None, :] for a in rope_cos_sin(cfg, np.arange(T)))
    keys = torch.arange(T, device=device)
    group = nh // nkv
    with torch.no_grad():
        x = w("model.embed_tokens.weight")[ids]                        # (T, H)
        for layer in range(cfg.num_hidden_layers):
            p = f"model.layers.{layer}."
            h = rms_norm(x, w(p + "input_layernorm.weight"))
            q = rope((h @ w(p + "self_attn.q_proj.weight").T).reshape(T, nh, hd))
            k = rope((h @ w(p + "self_attn.k_proj.weight").T).reshape(T, nkv, hd))
            v = (h @ w(p + "self_attn.v_proj.weight").T).reshape(T, nkv, hd)
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)   # (T, nh, hd)
            attn = torch.empty(T, nh, hd, device=device)
            for first in range(0, T, query_chunk):                     # a block of queries at a time
                rows = slice(first, min(first + query_chunk, T))
                scores = torch.einsum("qhd,khd->hqk", q[rows], k) / np.sqrt(hd)          # (nh, rows, T)
                scores.masked_fill_(keys[None, None, :] > keys[rows][None, :, None], float("-inf"))
                attn[rows] = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)
                del scores
            x = x + attn.reshape(T, nh * hd) @ w(p + "self_attn.o_proj.weight").T
            h = rms_norm(x, w(p + "post_attention_layernorm.weight"))
            gate, up = h @ w(p + "mlp.gate_proj.weight").T, h @ w(p + "mlp.up_proj.weight").T
            x = x + (torch.nn.functional.silu(gate) * up) @ w(p + "mlp.down_proj.weight").T
        h = rms_norm(x[T - keep:], w("model.norm.weight"))
        head = w("model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight")
        return (h @ head.T).cpu().numpy()
