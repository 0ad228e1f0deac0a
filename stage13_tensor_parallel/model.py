"""The Llama forward pass on the GPU for a step: R packed rows, each a token of some sequence at some position.

forward(step) runs the rows of a StepInputs (packing.py): decode rows and prompt chunks of any sequences, side
by side, no padding. Every GEMM has M = R rows, so the weights are read once per forward for all the sequences
in it: what batching buys.

    x = embed(tokens)                                                        (R, H)    the residual stream
    for each layer:
        h = rms_norm(x) * w_in                  [add_rms_norm fuses the previous layer's  x += d]
        q, k, v = h @ Wqkv^T                    (R, (nh + 2 nkv) hd)   one GEMM: q/k/v weights adjacent
        q, k = rope(q, k, positions)                                   each row at its own position, and
        K[slot_mapping], V[slot_mapping] = k, v                        each row's cache slot, in its blocks:
                                                                       one kernel (rope_kv_write.cu)
        a = causal_gqa_attention(q, K, V through the row's block table, keys 0..position)  (R, nh hd)  online
                 softmax, no score matrix, on tensor cores: prompt chunks a tile of rows a block (on an H100
                 or H200, Hopper's pipeline: wgmma, TMA, a producer), decode rows a block each with their
                 keys split over blocks (flash-decoding), the last to finish merging them; K/V read block by block
        d = a @ Wo^T;            x += d;  h = rms_norm(x) * w_post       (one fused kernel)
        g, u = h @ Wgate_up^T   (R, 2 I)                                 one GEMM: gate/up adjacent
        d = (silu(g) * u) @ Wdown^T
    x += d;  h = rms_norm(x) * w_final;  logits = h[logit_rows] @ E^T   (the LM head is the embedding, tied)

The GEMMs are cuBLAS's, or for a few rows gemv.cu's plain GEMV where the engine timed it faster (plain_shapes,
linear()). A step of a few rows of a size in fused_sizes (where the engine timed it faster again) streams each
layer's weights through gemv.cu with what stands around each GEMM fused into it: five kernels a layer, not nine:

    qkv = (rms_norm(x) * w_in) @ Wqkv^T, rope, K/V  the norm, rope and cache write in the GEMV (gemv_norm_rope)
    attention                                       as above
    x += a @ Wo^T                                   the residual add in its epilogue (gemv_residual)
    act = silu(g) * u, [g | u] = (rms_norm(x) * w_post) @ Wgate_up^T     norm and SwiGLU (gemv_norm_silu)
    x += act @ Wdown^T                              (gemv_residual)

and, at the sizes of those in head_sizes, the final norm, the LM head and each row's greedy token in one GEMV
(gemv_norm_head; the sampler takes its ids for the greedy rows instead of reading the logits again).

Split over N GPUs (tensor_parallel.py), each rank runs this forward with its own heads and MLP columns (its
config says how many) and its slice of the LM head, and the ranks meet in three places (communicator.py):

    d = a @ Wo_r^T;    all-reduce(d)       row-parallel: each rank's partial sum, summed on every rank, before
    d = act @ Wdown_r^T; all-reduce(d)     the norm adds it into x (fused: rank 0 adds x into its partial, the
                                           others write theirs alone, and x itself is all-reduced)
    logits = all-gather(h @ Whead_r^T)     every rank gets the whole rows, and samples them as every other does

Buffer reuse: every activation buffer is allocated once, for max_num_batched_tokens rows, and each forward uses
its first R rows; the layers take turns in the same buffers. No allocation happens while generating, so the
activations' peak is what the constructor allocates: the engine measures it (free memory before and after) and
sizes the paged KV cache from what is left, then hands it over with allocate_cache(num_blocks).

The block tables live on the GPU from step to step, a row of table_width = max_model_len / block_size entries
per seq_slot; a step's upload carries only the entries that changed (packing.StepInputs.table_updates), and
block_table.cu writes them before the first layer.
"""
from __future__ import annotations

import contextlib

import numpy as np

from common.config import LlamaConfig
from common.cublas import Cublas
from common.device import DeviceArray, Gpu, PinnedBuffer
from common.rope import rope_cos_sin

from .block_manager import blocks_for
from .cache import KVCache
from .kernels import (ATTENTION_MAX_GROUP, GEMV_MAX_ROWS, HOPPER_TILE_M, HOPPER_TILE_N, MAX_PARTS, Kernels,
                      decode_split, hopper_partial_floats, tile_rows)
from .packing import StepInputs, plan_attention, split_tail
from .tma import kv_tensor_maps
from .weights import GpuWeights

PARTIAL_ROWS_PER_SEQ = 4   # flash-decoding's partials hold 4 (row, split) pairs per seq_slot: enough splits where
#                            few rows are decoding, which is where splits are needed
STAGING = 4                # pinned buffers the host's copies to the GPU take turns in: a step queues at most two
#                            (its sampling parameters, its inputs), so a buffer comes round two steps later, once
#                            the loop has read that step's ids, and refilling it does not wait


class Model:
    def __init__(self, weights: GpuWeights, config: LlamaConfig, gpu: Gpu, kernels: Kernels, max_num_seqs: int,
                 max_model_len: int, max_num_batched_tokens: int, block_size: int, comm=None):
        self.weights, self.config, self.gpu, self.kernels = weights, config, gpu, kernels
        self.comm = comm                                    # the ranks' communicator, or None: one GPU
        self.cublas = Cublas(gpu)
        self.gemv_shapes: dict[tuple[int, int, int], int] = {}   # (M, N, K) -> the fastest column_warps of
        #                                                          gemv.cu's fused kind there (graphs.pick_gemms)
        self.plain_shapes: dict[tuple[int, int, int], int] = {}  # (M, N, K) -> its plain GEMV's, where that
        #                                                          beat cuBLAS: the unfused path's GEMMs
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
        self.cache: KVCache | None = None                   # allocate_cache(), once the activations are measured
        self.block_size = block_size
        self.table_width = W = blocks_for(L, block_size)
        self.block_tables = gpu.empty((B, W), "i32")        # seq_slot b's blocks, in position order
        gpu.fill_bytes(self.block_tables, 0)                # block 0 until written: never a read outside the pool
        # ---- every activation, allocated once for R rows (shapes per row)
        # the most prompt tiles a Hopper launch splits (those of its last wave: fewer blocks than SMs), and the
        # pieces that adds (packing.split_tail)
        self.split_slots = -(-kernels.sms // nkv)
        extra = 8 * (MAX_PARTS - 1) * self.split_slots
        self.inputs = gpu.empty((19 * R + 1 + extra,), "i32")   # one step's tokens | positions | slot_mapping (R
        #               each) | logit rows | their seq_slots | counters (n <= R each) | the decode split's keys
        #               per split | prompt tiles (4 numbers each; on Hopper pieces of 8, `extra` more) | decode
        #               tiles (4 numbers each, <= R tiles in all) | block-table
        #               updates (2 numbers each, < 2 R: a chunk of n rows brings at most n / BS + 1 blocks) |
        #               prev_rows (R, where any), in one copy (a captured decode graph reads its own layout of
        #               it: graphs.py)
        # prompt tiles on Hopper's pipeline where the GPU and the shapes allow (attention_hopper.cu), with its
        # tiles of 192 M-rows (head_dim 64) or 128; else attention_tiles.cu's of 64 (0: this head_dim takes every
        # row alone)
        self.hopper = kernels.hopper_prefill(hd, block_size)
        self.tile_rows = HOPPER_TILE_M[hd] // (nh // nkv) if self.hopper else tile_rows(nh, nkv, hd)
        if self.hopper:                                     # the records of split prompt tiles (attention_hopper.cu)
            self.hopper_partial = gpu.empty((hopper_partial_floats(self.split_slots, nkv, hd),), "f32")
            self.hopper_arrivals = gpu.empty((self.split_slots * nkv,), "i32")
            gpu.fill_bytes(self.hopper_arrivals, 0)         # zero between launches
        self.kv_maps: DeviceArray | None = None             # the cache's TMA tensor maps, with the cache, and
        self.layer_maps: list[DeviceArray] = []             # each layer's two of them (K, V), viewed once
        self.partial_rows = PARTIAL_ROWS_PER_SEQ * B        # flash-decoding's (decode tile, split) pairs, at most
        self.partial = gpu.empty((self.partial_rows * nh * (hd + 2),), "f32")
        self.arrivals = gpu.empty((self.partial_rows * nkv,), "i32")   # a split row's blocks done, per K/V head:
        gpu.fill_bytes(self.arrivals, 0)                    # zero between launches (split_combine.cuh)
        self.x = gpu.empty((R, H), "bf16")                  # residual stream
        self.h = gpu.empty((R, H), "bf16")                  # normed input of the next GEMM
        self.qkv = gpu.empty((R, self.qkv_width), "bf16")
        self.attn = gpu.empty((R, nh * hd), "bf16")
        self.d = gpu.empty((R, H), "bf16")                  # a sublayer's output, added into x by the next norm
        self.gate_up = gpu.empty((R, 2 * inter), "bf16")
        self.act = gpu.empty((R, inter), "bf16")
        self.logits = gpu.empty((B, c.vocab_size), "f32")   # the logit rows of a step, for sampling
        if comm is not None:     # the LM head split: this rank's slice of B rows' logits, padded to the widest
            #                      slice (a gather sends equal counts), and every rank's, back to back
            self.split_over, self.slice_width = N, P = comm.size, -(-c.vocab_size // comm.size)
            self.slice_logits, self.gathered = gpu.empty((B * P,), "f32"), gpu.empty((N * B * P,), "f32")
        self.next_ids = gpu.empty((B,), "i32")              # the sampler's choices
        # every seq_slot's sampling parameters, written at admission: seed u64 | temperature f32 | top_k i32 |
        # top_p f32
        self.sampling = gpu.empty((20 * B,), "u8")
        self._sampling_host = np.zeros(20 * B, np.uint8)   # its host mirror: one seq_slot is rewritten at a time,
        self._params_changed = False                        # and copied with the next step's inputs
        self.seed, self.temperature = self.sampling.view(0, (B,), "u64"), self.sampling.view(8 * B, (B,), "f32")
        self.top_k, self.top_p = self.sampling.view(12 * B, (B,), "i32"), self.sampling.view(16 * B, (B,), "f32")
        self.counters = self.logit_seq_slots = self.inputs.view(0, (B,))   # set by each forward's upload
        cos, sin = rope_cos_sin(c, np.arange(L))            # (L, hd/2) each, fp32
        self.cos, self.sin = gpu.to_device(cos), gpu.to_device(sin)
        self.layers = [self._layer_weights(i) for i in range(c.num_hidden_layers)]
        # steps of these sizes take gemv.cu with the norms, SwiGLU and residual adds fused in (graphs.pick_fused
        # times both paths); only where every weight it streams suits its 16-byte loads (K a multiple of 8,
        # 16-byte aligned)
        streamed = [a for w in self.layers for a in w.values()]
        self.fusable = all(a.shape[-1] % 8 == 0 and a.ptr % 16 == 0 for a in streamed)
        self.fused_sizes: set[int] = set()
        # of those, the sizes whose final norm, LM head and greedy argmax are one GEMV (graphs.pick_head): its
        # blocks' argmaxes meet in head_best and head_ticket (zero between launches), the ids land in head_ids
        self.head_sizes: set[int] = set()
        self.head_best, self.head_ticket = gpu.empty((GEMV_MAX_ROWS,), "u64"), gpu.empty((1,), "i32")
        gpu.fill_bytes(self.head_best, 0)
        gpu.fill_bytes(self.head_ticket, 0)
        self.head_ids = gpu.empty((GEMV_MAX_ROWS,), "i32")
        self.greedy_ids: DeviceArray | None = None         # head_ids where the last forward's head wrote them
        self._staging = [PinnedBuffer(max(self.inputs.nbytes, self.sampling.nbytes)) for _ in range(STAGING)]
        self._staged = [None] * STAGING                     # the event after each one's last copy
        self._stage_turn = 0

    def allocate_cache(self, num_blocks: int) -> None:
        self.cache = KVCache(self.config, num_blocks, self.block_size, self.gpu)
        if self.hopper:
            self.kv_maps = kv_tensor_maps(self.gpu, self.cache)
            self.layer_maps = [self.kv_maps.view(2 * i * 128, (2, 16)) for i in range(len(self.layers))]

    def _layer_weights(self, i: int) -> dict[str, DeviceArray]:
        w, p = self.weights, f"model.layers.{i}."
        return {"in_norm": w[p + "input_layernorm.weight"], "qkv": w.fused(i, "qkv"),
                "o": w[p + "self_attn.o_proj.weight"], "post_norm": w[p + "post_attention_layernorm.weight"],
                "gate_up": w.fused(i, "gate_up"), "down": w[p + "mlp.down_proj.weight"]}

    @contextlib.contextmanager
    def alone(self):
        """This rank's kernels without the collectives, for the `with` (graphs.py times one GPU's share of a
        layer, the same on every rank)."""
        comm, self.comm = self.comm, None
        try:
            yield
        finally:
            self.comm = comm

    def all_reduce(self, buf: DeviceArray) -> None:
        if self.comm is not None:
            self.comm.all_reduce(buf)

    @staticmethod
    def row_view(buf: DeviceArray, first: int, n: int) -> DeviceArray:
        """Rows [first, first + n) of a (R, C) buffer, as an (n, C) array."""
        cols = buf.shape[1]
        return buf.view(first * cols * (buf.nbytes // buf.size), (n, cols))

    def copy_in(self, dst: DeviceArray, host: np.ndarray) -> None:
        """Queue the copy of host bytes into the start of dst, through the next of the pinned staging buffers.
        A buffer is refilled once its own last copy is done: that copy's event is waited for, not the stream,
        so the step in flight runs on while the host fills the buffer (asynchronous scheduling, llm_engine.py)."""
        turn = self._stage_turn
        self._stage_turn = (turn + 1) % STAGING
        if self._staged[turn] is not None:
            self._staged[turn].sync()
        stage = self._staging[turn]
        if host.nbytes > min(stage.nbytes, dst.nbytes):
            raise ValueError(f"a copy of {host.nbytes} bytes into a {dst.nbytes}-byte buffer through "
                             f"{stage.nbytes}-byte staging")
        stage.array[: host.nbytes] = host.reshape(-1).view(np.uint8)
        self.gpu.copy_to_device_async(dst.ptr, stage.ptr, host.nbytes)
        self._staged[turn] = self.gpu.stream.record()

    def set_params(self, seq_slot: int, params, seed: int) -> None:
        """One sequence's sampling parameters into its seq_slot, written when it is admitted (the other
        seq_slots keep theirs); they reach the GPU with the next step's inputs (upload_params)."""
        B, host = self.max_num_seqs, self._sampling_host
        host[8 * seq_slot:8 * seq_slot + 8].view(np.uint64)[0] = seed
        host[8 * B + 4 * seq_slot:8 * B + 4 * seq_slot + 4].view(np.float32)[0] = params.temperature
        host[12 * B + 4 * seq_slot:12 * B + 4 * seq_slot + 4].view(np.int32)[0] = params.top_k
        host[16 * B + 4 * seq_slot:16 * B + 4 * seq_slot + 4].view(np.float32)[0] = params.top_p
        self._params_changed = True

    def upload_params(self) -> None:
        """Queue the copy of every seq_slot's sampling parameters if set_params() changed any since the last:
        one copy for all the sequences a step admits, queued before its kernels."""
        if self._params_changed:
            self.copy_in(self.sampling, self._sampling_host)
            self._params_changed = False

    def check_step(self, step: StepInputs, logits: DeviceArray | None = None) -> None:
        """Refuse a step whose values the kernels would read or write outside their buffers."""
        R, n = step.num_rows, len(step.logit_rows)
        if n > self.max_num_seqs and logits is None:
            raise ValueError(f"{n} logit rows: the engine's logits hold {self.max_num_seqs}")
        if not 0 < R <= self.max_rows:
            raise ValueError(f"a forward of {R} rows: the engine holds 1..{self.max_rows}")
        for name, slots in (("seq_slots", step.seq_slots), ("logit_seq_slots", step.logit_seq_slots)):
            if len(slots) and (slots.min() < 0 or slots.max() >= self.max_num_seqs):   # the kernels cannot
                raise ValueError(f"{name} {slots.min()}..{slots.max()} outside the {self.max_num_seqs} the "
                                 "engine holds")
        updates = step.table_updates
        if len(updates) and (updates[:, 0].max() >= self.block_tables.size or updates[:, 1].max() >=
                             self.cache.num_blocks or updates.min() < 0):     # the kernels would write or read
            raise ValueError(f"block-table updates outside the {self.block_tables.shape} tables or the "
                             f"{self.cache.num_blocks} blocks")
        if len(updates) > 2 * self.max_rows:
            raise ValueError(f"{len(updates)} block-table updates in one step: the inputs hold {2 * self.max_rows}")
        prev = step.prev_rows                     # indices into the step before's sampled ids (next_ids)
        if prev is not None and (len(prev) != R or prev.max() >= self.max_num_seqs):
            raise ValueError(f"prev_rows of {len(prev)} rows up to {prev.max()}: the step has {R} rows and the "
                             f"sampler writes {self.max_num_seqs} ids")

    def upload_step(self, step: StepInputs, logits: DeviceArray | None = None) -> tuple[DeviceArray, ...]:
        """Queue the copy of a step's inputs to the GPU (one copy); returns the device views that run_uploaded()
        reads: tokens, positions, slot_mapping, logit_rows, attention's plan (prompt tiles, decode tiles, the
        decode tiles' split: n_splits and a view of keys_per_split), the block-table updates and prev_rows.
        The sampling parameters of sequences admitted since the last step go first (upload_params)."""
        self.check_step(step, logits)
        self.upload_params()
        R, n = step.num_rows, len(step.logit_rows)
        prompt, decode = plan_attention(step.spans, self.tile_rows)
        parts = 1
        if self.hopper and len(prompt):                   # the last wave's tiles split by keys, where that pays
            hd, nkv = self.config.head_dim, self.config.num_key_value_heads
            prompt, parts = split_tail(prompt, HOPPER_TILE_N[hd], nkv, self.kernels.sms)
        n_splits, per_split = (decode_split(len(decode), int(decode[:, 3].max()) + 1, self.config.num_key_value_heads,
                                            self.kernels.sms, self.partial_rows) if len(decode) else (1, 0))
        updates, prev = step.table_updates, step.prev_rows
        self.copy_in(self.inputs, np.concatenate([step.tokens, step.positions, step.slot_mapping, step.logit_rows,
                                                  step.logit_seq_slots, step.counters, [per_split],
                                                  prompt.reshape(-1), decode.reshape(-1), updates.reshape(-1),
                                                  prev if prev is not None else []]).astype(np.int32))
        at, np_, nd, nu = self.inputs.view, len(prompt), len(decode), len(updates)
        self.logit_seq_slots = at(4 * (3 * R + n), (n,))
        self.counters = at(4 * (3 * R + 2 * n), (n,))
        end, width = 4 * (3 * R + 3 * n + 1), prompt.shape[1]   # a prompt tile's numbers: 4, or a piece's 8
        tiles_end = end + 4 * width * np_ + 16 * nd
        return (at(0, (R,)), at(4 * R, (R,)), at(8 * R, (R,)), at(12 * R, (n,)),
                (at(end, (np_, width)), parts) if np_ else None, at(end + 4 * width * np_, (nd, 4)) if nd else None,
                (n_splits, at(end - 4, (1,))), at(tiles_end, (nu, 2)) if nu else None,
                at(tiles_end + 8 * nu, (R,)) if prev is not None else None)

    def forward(self, step: StepInputs, logits: DeviceArray | None = None) -> DeviceArray:
        """Upload the step's inputs and run it (see run_uploaded())."""
        return self.run_uploaded(step, self.upload_step(step, logits), logits)

    def run_uploaded(self, step: StepInputs, inputs, logits: DeviceArray | None = None) -> DeviceArray:
        """Run the rows of `step` from its uploaded `inputs`, writing their K/V into the cache; the logits of
        step.logit_rows go to rows 0..n-1 of self.logits (B, V) f32 (at most one per sequence), or into `logits`
        (n, V) f32 when given. Queues GPU work; does not wait."""
        return self.run_rows(step.num_rows, len(step.logit_rows), inputs, logits)

    def run_rows(self, R: int, n: int, inputs, logits: DeviceArray | None = None) -> DeviceArray:
        """run_uploaded() for R rows and n logit rows, from device views alone: no host value of the step is
        read, so a CUDA graph can capture it (graphs.py)."""
        c, k = self.config, self.kernels
        tokens, positions, slot_mapping, logit_rows, prompt_tiles, decode_tiles, split, updates, prev_rows = inputs
        if updates is not None:                       # the blocks this step's sequences got since the last
            k.block_table_write(self.block_tables, updates)
        nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        view = self.row_view
        x, qkv, attn = view(self.x, 0, R), view(self.qkv, 0, R), view(self.attn, 0, R)
        k.embedding(tokens, self.weights["model.embed_tokens.weight"], x, prev_rows, self.next_ids)
        fused = R in self.fused_sizes
        for i in range(len(self.layers)):
            self.project_qkv(i, R, fused, (positions, slot_mapping))
            k_cache, v_cache = self.cache.layer(i)
            if prompt_tiles is not None and self.hopper:
                pieces, parts = prompt_tiles
                k.attention_hopper(qkv, attn, self.layer_maps[i], pieces, self.block_tables, nh, nkv, hd,
                                   self.block_size, parts, self.hopper_partial, self.hopper_arrivals)
            elif prompt_tiles is not None:
                k.attention(qkv, k_cache, v_cache, attn, self.partial, self.arrivals, prompt_tiles[0],
                            self.block_tables, nh, nkv, hd)
            if decode_tiles is not None:
                k.attention(qkv, k_cache, v_cache, attn, self.partial, self.arrivals, decode_tiles,
                            self.block_tables, nh, nkv, hd, *split)
            self.finish_layer(i, R, fused)
        return self.final_logits(R, n, logit_rows, fused, logits)

    def final_logits(self, R: int, n: int, logit_rows: DeviceArray, fused: bool,
                     logits: DeviceArray | None = None) -> DeviceArray:
        """After the layers over R rows: the logits of the n rows logit_rows (n,) i32 into rows 0..n-1 of
        self.logits, or into `logits` (n, V) f32. At a size in head_sizes (layers fused), one GEMV does the final
        norm and the LM head and finds each row's greedy token (greedy_ids, for the sampler); otherwise the norm
        (with the last residual add, unfused), the row gather, and cuBLAS."""
        k, view = self.kernels, self.row_view
        final, eps = self.weights["model.norm.weight"], self.config.rms_norm_eps
        x, h, d = view(self.x, 0, R), view(self.h, 0, R), view(self.d, 0, R)
        one_gemv = fused and R in self.head_sizes and n > 0
        self.greedy_ids = self.head_ids if one_gemv else None
        if not one_gemv:
            if fused:                                 # every residual add is done
                k.rms_norm(x, final, h, eps)
            else:
                k.add_rms_norm(x, d, final, h, eps)
        if n == 0:                                   # a step of prompt chunks that complete no prompt
            return self.row_view(self.logits, 0, 0)
        chosen = view(self.d, 0, n)                  # d is free again: it takes the rows whose logits are wanted
        if logits is None:                           # (n, V) of the (B, V) buffer, or the caller's
            logits = self.row_view(self.logits, 0, n)
        if one_gemv:                                 # the residual stream's rows, normed inside the GEMV
            k.embedding(logit_rows, x, chosen)       # a row gather, which is what the embedding kernel does
            lm_head = self.weights.lm_head
            k.gemv(chosen, lm_head, logits, self.gemv_shapes.get((n, *lm_head.shape)), norm=(final, eps),
                   head=(self.head_best, self.head_ticket, self.head_ids))
        else:
            k.embedding(logit_rows, h, chosen)
            if self.weights.lm_head.shape[0] == self.config.vocab_size:
                self.cublas.linear(chosen, self.weights.lm_head, logits)
            else:                                    # this rank's slice of the vocabulary
                self.gathered_logits(chosen, logits)
        return logits

    def gathered_logits(self, h: DeviceArray, logits: DeviceArray) -> None:
        """logits (n, V) = h (n, H) @ LM head^T with the vocabulary split over the ranks: this rank's slice of each
        row by cuBLAS, every rank's gathered (the slices padded to one width, back to back), then each slice into
        its columns; max_num_seqs rows at a time (the gather's buffers hold that many). Timed alone (no comm):
        this rank's slice only."""
        N, P, B, V = self.split_over, self.slice_width, self.max_num_seqs, logits.shape[1]
        head = self.weights.lm_head
        for first in range(0, h.shape[0], B):
            n = min(B, h.shape[0] - first)
            self.cublas.linear(self.row_view(h, first, n), head, self.slice_logits.view(0, (n, head.shape[0])))
            if self.comm is None:
                continue
            self.comm.all_gather(self.slice_logits.view(0, (n * P,)), self.gathered.view(0, (N * n * P,)))
            for r in range(N):
                self.gpu.copy_columns(self.row_view(logits, first, n), r * P,
                                      self.gathered.view(4 * r * n * P, (n, min(P, V - r * P))))

    def project_qkv(self, i: int, R: int, fused: bool, rows: tuple[DeviceArray, DeviceArray]) -> None:
        """Layer i's q, k, v of the first R rows: qkv = rms_norm(x) * w_in @ Wqkv^T (unfused, x += d first where
        the layer before left its MLP's output in d), q and k rotated at each row's position and k, v written to
        its cache slot; rows = (positions, slot_mapping), (R,) i32 each."""
        c, k, view = self.config, self.kernels, self.row_view
        w, eps = self.layers[i], c.rms_norm_eps
        if fused:                                     # the norm, rope and cache write inside the GEMV (gemv.cu)
            self.fused_gemm("qkv", i, R, rows)
            return
        x, h, qkv = view(self.x, 0, R), view(self.h, 0, R), view(self.qkv, 0, R)
        if i == 0:
            k.rms_norm(x, w["in_norm"], h, eps)
        else:
            k.add_rms_norm(x, view(self.d, 0, R), w["in_norm"], h, eps)
        self.linear(h, w["qkv"], qkv)
        positions, slot_mapping = rows
        k.rope_kv_write(qkv, *self.cache.layer(i), slot_mapping, c.num_attention_heads, c.num_key_value_heads,
                        c.head_dim, (self.cos, self.sin, positions))

    def finish_layer(self, i: int, R: int, fused: bool) -> None:
        """After layer i's attention, over the first R rows: x += attn Wo^T, then the MLP, act = silu(g) * u with
        [g | u] = rms_norm(x) * w_post @ Wgate_up^T, and its down projection: added into x (fused), or left in d
        for the next norm to add (unfused)."""
        k, view = self.kernels, self.row_view
        w, eps = self.layers[i], self.config.rms_norm_eps
        if fused:                                     # the norm, SwiGLU and residual adds inside the GEMVs
            for name in ("o", "gate_up", "down"):
                self.fused_gemm(name, i, R)
            return
        x, h, d, attn, act = (view(b, 0, R) for b in (self.x, self.h, self.d, self.attn, self.act))
        gate_up = view(self.gate_up, 0, R)
        self.linear(attn, w["o"], d)
        self.all_reduce(d)                            # every rank's partial sum (split over GPUs)
        k.add_rms_norm(x, d, w["post_norm"], h, eps)  # x += attention output
        self.linear(h, w["gate_up"], gate_up)
        k.silu_mul(gate_up, act)
        self.linear(act, w["down"], d)
        self.all_reduce(d)

    def linear(self, x: DeviceArray, w: DeviceArray, y: DeviceArray) -> None:
        """y = x @ w^T: gemv.cu's plain GEMV where it was measured faster than cuBLAS for this (M, N, K), at the
        warps a column that were fastest (plain_shapes), else cuBLAS."""
        column_warps = self.plain_shapes.get((x.shape[0], *w.shape))
        if column_warps is not None:
            self.kernels.gemv(x, w, y, column_warps)
        else:
            self.cublas.linear(x, w, y)

    def fused_gemm(self, name: str, i: int, R: int, rows: tuple[DeviceArray, DeviceArray] | None = None,
                   column_warps: int | None = None) -> None:
        """Layer i's GEMM `name` over the first R rows through gemv.cu with its neighbours fused in (the module's
        docstring), at column_warps warps a column: given, or the fastest timed for the shape
        (graphs.pick_gemms), or gemv.cu's default. qkv takes rows = (positions, slot_mapping)."""
        c, k, view = self.config, self.kernels, self.row_view
        w, eps = self.layers[i], c.rms_norm_eps
        x, act = view(self.x, 0, R), view(self.act, 0, R)
        if column_warps is None:
            column_warps = self.gemv_shapes.get((R, *w[name].shape))
        if name == "qkv":
            rope = (*self.cache.layer(i), rows[1], self.cos, self.sin, rows[0], c.num_attention_heads,
                    c.num_key_value_heads, c.head_dim)
            k.gemv(x, w["qkv"], view(self.qkv, 0, R), column_warps, norm=(w["in_norm"], eps), rope=rope)
        elif name == "o":          # split over GPUs: rank 0 adds x to its partial, the others store theirs
            k.gemv(view(self.attn, 0, R), w["o"], x, column_warps, residual=self.adds_residual)
            self.all_reduce(x)
        elif name == "gate_up":
            k.gemv(x, w["gate_up"], act, column_warps, norm=(w["post_norm"], eps), silu=True)
        elif name == "down":
            k.gemv(act, w["down"], x, column_warps, residual=self.adds_residual)
            self.all_reduce(x)
        else:
            raise ValueError(f"fused_gemm: no layer GEMM {name!r} (qkv, o, gate_up, down)")

    @property
    def adds_residual(self) -> bool:
        """Whether this rank's row-parallel GEMVs add x into their output: on one GPU, and on rank 0 of several
        (the all-reduce then sums x once and every rank's partial)."""
        return self.comm is None or self.comm.rank == 0

    def queue_sample_rows(self, n: int, seq_slots: DeviceArray | None = None,
                          counters: DeviceArray | None = None) -> DeviceArray:
        """Queue the sampler over the first n logits rows of a packed step, row i with the parameters of the
        seq_slot the last upload gave it (logit_seq_slots, or `seq_slots`) and its counter; returns the (n,) i32
        it writes."""
        out = self.next_ids.view(0, (n,))
        self.kernels.sample(self.row_view(self.logits, 0, n), self.temperature, self.top_k, self.top_p, self.seed,
                            self.logit_seq_slots if seq_slots is None else seq_slots,
                            self.counters if counters is None else counters, out, self.greedy_ids)
        return out
