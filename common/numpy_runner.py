"""A stage's runner on the CPU: one step's packed rows through the numpy reference model, with a real KV cache.

From stage05 on an engine is a loop (scheduler, packing, from stage07 a block manager) over a runner that takes
one step's packed rows (the stage's packing.StepInputs) and returns the sampled id of each logit row. On a GPU
the runner is the stage's model. Without one it is this class, so that the command line and the server over any
stage run that stage's own loop on any machine, and fast enough to be used: the loop's packed rows go through
the model together (one matrix product a weight for every row of the step, one lm_head product for every logit
row), where the plain reference engine re-runs each sequence alone, token by token.

    admit(seq)        the sequence's sampling parameters and seed into its seq_slot
    run(x) -> ids     the rows of x: each row's K and V written to the cache at x.slot_mapping, each row
                      attending to its sequence's keys 0..position, read back from the cache as the stage's
                      attention reads them (below); then the sampler over the logit rows
    launch(x)         run(x), as a handle whose result() gives the ids (the shape of an asynchronous runner:
                      here the step has run when launch returns)

Where a row's keys are, as the stage's kernels find them:
    contiguous (block_size None)  seq_slot s holds positions 0..max_model_len-1 at slots s * max_model_len + j
    paged (block_size BS)         position j of seq_slot s is at table[s, j // BS] * BS + j % BS, the table kept
                                  here from each step's table_updates, as block_table.cu keeps the GPU's copy
A row whose token the step before was still sampling (x.prev_rows[r] = i >= 0, asynchronous scheduling) reads
the i-th id that step sampled, as the embedding kernel does on the GPU.

Sampling is the reference's definition (sample_reference) with a generator seeded by (the sequence's seed, the
draw's counter), so a draw depends on nothing but the request and its index: a sequence preempted and
recomputed draws the same tokens again, as the GPU sampler's counter-based draws do. Greedy requests get the
reference engine's tokens. Tested against the plain reference in every stage's tests/test_cpu_engine.py.
"""
from __future__ import annotations

import numpy as np

from common.reference import ReferenceModel, apply_rope, rms_norm, sample_reference, silu, softmax
from common.rope import rope_cos_sin


def kv_bytes_per_position(model: ReferenceModel) -> int:
    """float32 K and V of one position, every layer."""
    cfg = model.config
    return cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 4


class Ready:
    """A step's sampled ids, already computed."""

    def __init__(self, ids: np.ndarray):
        self.ids = ids

    def result(self) -> np.ndarray:
        return self.ids


class NumpyRunner:
    def __init__(self, model: ReferenceModel, max_num_seqs: int, max_model_len: int, num_slots: int,
                 block_size: int | None = None):
        cfg = self.config = model.config
        self.model, self.max_model_len, self.block_size = model, max_model_len, block_size
        shape = (cfg.num_hidden_layers, num_slots, cfg.num_key_value_heads, cfg.head_dim)
        self.k_cache, self.v_cache = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        if block_size is not None:
            width = -(-max_model_len // block_size)                       # block-table entries per seq_slot
            self.table = np.full((max_num_seqs, width), -1, np.int64)
        self.params: list = [None] * max_num_seqs                         # seq_slot -> (SamplingParams, seed)
        self._last_ids = np.zeros(0, np.int32)                            # the step before's sampled ids

    def admit(self, seq) -> None:
        self.params[seq.seq_slot] = (seq.params, seq.seed)

    def launch(self, x) -> Ready:
        return Ready(self.run(x))

    def run(self, x) -> np.ndarray:
        tokens = np.asarray(x.tokens, np.int64)
        prev = getattr(x, "prev_rows", None)
        if prev is not None:                                              # placeholders: the step before's ids
            tokens = np.where(prev >= 0, self._last_ids[np.maximum(prev, 0)], tokens)
        updates = getattr(x, "table_updates", None)
        if updates is not None and len(updates):
            self.table.reshape(-1)[updates[:, 0]] = updates[:, 1]
        logits = self.forward(tokens, x.positions, x.slot_mapping, x.seq_slots, x.logit_rows)   # (n, V)
        ids = logits.argmax(axis=1).astype(np.int32)                        # greedy rows: the reference's rule
        for i, (slot, counter) in enumerate(zip(x.logit_seq_slots, x.counters)):
            params, seed = self.params[slot]
            if not params.greedy:                                          # a generator only where one draws
                ids[i] = sample_reference(logits[i], params, np.random.default_rng([seed, int(counter)]))
        self._last_ids = ids
        return ids

    def key_slots(self, seq_slot: int, n: int) -> np.ndarray:
        """Cache slots of positions 0..n-1 of the sequence in seq_slot."""
        j = np.arange(n)
        if self.block_size is None:
            return seq_slot * self.max_model_len + j
        blocks = self.table[seq_slot, j // self.block_size]
        assert (blocks >= 0).all(), f"seq_slot {seq_slot}: a block-table entry was never written"
        return blocks * self.block_size + j % self.block_size

    def forward(self, tokens, positions, slot_mapping, seq_slots, logit_rows) -> np.ndarray:
        """Logits (n, V) of the logit rows, after every row's K/V went into the cache. Rows are grouped into
        chunks (consecutive rows of one seq_slot at consecutive positions): a chunk's rows share its keys."""
        cfg, w = self.config, self.model.w
        R, nh, nkv, hd = len(tokens), cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        positions, seq_slots = np.asarray(positions), np.asarray(seq_slots)
        starts = np.flatnonzero(np.r_[True, (seq_slots[1:] != seq_slots[:-1]) |
                                      (positions[1:] != positions[:-1] + 1)])
        chunks = list(zip(starts, np.diff(np.r_[starts, R])))            # (first row, rows)
        cos, sin = rope_cos_sin(cfg, positions)
        x = w["model.embed_tokens.weight"][tokens]                        # (R, H)
        for layer in range(cfg.num_hidden_layers):
            p = f"model.layers.{layer}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
            q = apply_rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(R, nh, hd), cos, sin)
            k = apply_rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(R, nkv, hd), cos, sin)
            self.k_cache[layer, slot_mapping] = k
            self.v_cache[layer, slot_mapping] = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(R, nkv, hd)
            attn = np.empty((R, nh, hd), np.float32)
            for first, n in chunks:
                attn[first:first + n] = self._attend(layer, q[first:first + n], int(seq_slots[first]),
                                                     int(positions[first]))
            x = x + attn.reshape(R, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            x = x + (silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        return rms_norm(x[logit_rows], w["model.norm.weight"], cfg.rms_norm_eps) @ self.model.lm_head.T

    def _attend(self, layer: int, q: np.ndarray, seq_slot: int, start: int) -> np.ndarray:
        """Causal attention of a chunk's n queries (n, nh, hd) at positions start.. over its cached keys."""
        n, nh, hd = q.shape
        slots = self.key_slots(seq_slot, start + n)                       # keys 0 .. start + n - 1
        group = nh // self.config.num_key_value_heads                      # query heads per KV head (GQA)
        k = np.repeat(self.k_cache[layer, slots], group, axis=1)          # (S, nh, hd)
        v = np.repeat(self.v_cache[layer, slots], group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)            # (nh, n, S)
        future = np.arange(start + n)[None, :] > (start + np.arange(n))[:, None]   # key j after query i
        scores[:, future] = -np.inf
        return np.einsum("hqk,khd->qhd", softmax(scores), v)
