"""CUDA graphs for decode steps: the forward and the sampler captured once per batch size, replayed with one launch.

At batch 1 a decode step is ~200 launches of kernels that each run a few microseconds; queueing one from Python
costs about as much, so the GPU waits on the host. A CUDA graph records the step's launches once (Gpu.capture) and
replays them all with one call. What a replay cannot do is change anything the host chose: the kernels, their
grids and their arguments (pointers and scalars) are the captured ones. So:

  - every input lives in device memory at a fixed address: the step's tokens, positions, slot mapping, logit
    rows, their seq_slots and counters, attention's decode tiles and the split's keys per split are copied, in
    one transfer, into a layout fixed per batch size (decode_layout); the block tables and the sampling
    parameters already live on the GPU, by seq_slot;
  - shapes are fixed, so a graph is captured for each of a ladder of batch sizes (CAPTURE_SIZES, powers of two;
    vLLM's ladder is 1, 2, 4 and then every multiple of 8, finer and with more graphs) and a step of R rows
    replays the smallest that holds them, padded with rows that write nowhere: slot -1 (the cache write skips
    it), attending to position 0 of seq_slot 0's table (a read of a block in the pool), their logits and samples
    in rows nobody reads;
  - the decode split's grid is the most blocks any step of that size may use (its keys at max_model_len); each
    step's keys per split is an input, and the blocks past a row's keys return at once.

A small step may stream each layer GEMM through gemv.cu, plain or with its neighbours fused in (model.py). Before
capture, at each captured size up to 8 rows, each layer GEMM is timed through cuBLAS, through the plain GEMV and
through the fused one, each GEMV with 1, 2, 4 and 8 warps a column (pick_gemms): the unfused path takes the plain
GEMV where it beat cuBLAS. Then every layer's GEMMs with the kernels between them, fused against unfused (the faster
of cuBLAS and the plain GEMV, the norms, rope, silu_mul), and a size takes the faster (pick_fused); then, at each
fused size, the step's end (the final norm, the LM head, the greedy sampler) apart against in one GEMV (pick_head).
Each is timed from a graph of all the layers (so the weights come from HBM, not L2, and no launch gap is timed),
once per machine: the times are kept on disk (gemm_timings.py), so every later engine takes the same kernels and
gives the same bits.

Only steps of decode rows replay; a step with a prompt chunk runs eagerly (its shapes vary with the chunk), as
vLLM's first engine did. Block-table updates, which vary in number, are written by their kernel before the replay.

    DecodeGraphs(model).capture()      at start: the GEMMs picked, then one graph per size, after an eager
                                       warm-up run of each
    launch(step) -> size | None        the step queued (its inputs' copy, its block-table updates, the replay);
                                       None: not a decode step the graphs hold (the caller runs it eagerly)
"""
from __future__ import annotations

import time

import numpy as np

from .gemm_timings import GemmTimings
from .kernels import GEMV_COLUMN_WARPS, GEMV_MAX_ROWS, GEMV_PAIRED_MAX_WARPS, decode_split
from .packing import StepInputs

CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FIELDS = (("tokens", 1, 0), ("positions", 1, 0), ("slot_mapping", 1, -1), ("logit_rows", 1, None),
          ("logit_seq_slots", 1, 0), ("counters", 1, 0), ("prev_rows", 1, -1),
          ("tiles", 4, None))                                                  # (name, ints a row, padding)


GEMM_BUFFERS = {"qkv": ("h", "qkv"), "o": ("attn", "d"), "gate_up": ("h", "gate_up"), "down": ("act", "d")}
#                 the unfused path's input and output of each layer GEMM (cuBLAS, gemv.cu's plain GEMV)


def gpu_us(gpu, work, repeats: int = 3) -> float:
    """GPU microseconds of work(), captured as a graph and replayed between two events (the median of
    `repeats` replays after one): the kernels back to back, no launch gap timed."""
    work()                                          # cuBLAS sets itself up for the shape outside the capture
    graph, times = gpu.capture(work), []
    graph.launch()
    for _ in range(repeats):
        start = gpu.record()
        graph.launch()
        end = gpu.record()
        end.sync()
        times.append(1e3 * (end - start))
    return sorted(times)[len(times) // 2]


def pick_gemms(model, sizes: list[int], timings: GemmTimings) -> dict[tuple[str, int], tuple]:
    """For each layer GEMM (qkv, o, gate_up, down) and each M in `sizes` up to GEMV_MAX_ROWS, the GPU time of one
    through cuBLAS, through gemv.cu's plain GEMV (what the unfused path streams with) and through gemv.cu with its
    neighbours fused in (model.fused_gemm), each gemv.cu kind at each of GEMV_COLUMN_WARPS warps a column (those
    that give every lane a load; the paired kinds, qkv and gate_up, at most GEMV_PAIRED_MAX_WARPS) with its
    fastest kept: each the mean over every layer's weights of that name (a pass over them all: the weights stream
    from HBM as in a step), or the times `timings` kept from an earlier engine on this machine.
    model.plain_shapes maps each (M, N, K) where the plain GEMV beat cuBLAS to its fastest warps a column;
    model.gemv_shapes each (M, N, K) to the fused kind's. Returns (name, M) -> (cuBLAS us, plain us, its warps,
    fused us, its warps)."""
    times = {}
    if not model.fusable:
        return times
    L = len(model.layers)
    for name, (src, dst) in GEMM_BUFFERS.items():
        N, K = model.layers[0][name].shape
        tried = [w for w in GEMV_COLUMN_WARPS if w == 1 or K >= 8 * 32 * w]
        paired = [w for w in tried if w <= GEMV_PAIRED_MAX_WARPS] if name in ("qkv", "gate_up") else tried
        for m in (r for r in sizes if r <= GEMV_MAX_ROWS):
            if (kept := timings.get("gemm", (name, m, N, K, L))) is None:
                x, y = model.row_view(getattr(model, src), 0, m), model.row_view(getattr(model, dst), 0, m)
                rows = padding_rows(model, m)

                def per_layer(work) -> float:
                    return gpu_us(model.gpu, lambda: [work(i) for i in range(L)]) / L

                blas = per_layer(lambda i: model.cublas.linear(x, model.layers[i][name], y))
                plain = min((per_layer(lambda i, w=w: model.kernels.gemv(x, model.layers[i][name], y, w)), w)
                            for w in tried)
                fused = min((per_layer(lambda i, w=w: model.fused_gemm(name, i, m, rows, w)), w) for w in paired)
                timings.put("gemm", (name, m, N, K, L), kept := [blas, *plain, *fused])
            times[(name, m)] = tuple(kept)
            blas, plain, plain_warps, _, fused_warps = kept
            if plain < blas:
                model.plain_shapes[(m, N, K)] = plain_warps
            model.gemv_shapes[(m, N, K)] = fused_warps
    return times


def pick_fused(model, sizes: list[int], timings: GemmTimings) -> dict[int, tuple[float, float]]:
    """For each M in `sizes` up to GEMV_MAX_ROWS, after pick_gemms: the GPU time of a layer's GEMMs and the
    kernels between them (rope and the cache write too; attention aside), unfused and fused (model.project_qkv,
    model.finish_layer), the mean over a pass through every layer, or as `timings` kept it. model.fused_sizes gets the M where fused took less, and
    model.gemv_shapes keeps only those sizes. Returns M -> (unfused us, fused us)."""
    times = {}
    if not model.fusable:
        return times
    c, L = model.config, len(model.layers)
    shape = (c.hidden_size, c.intermediate_size, model.qkv_width, c.num_attention_heads * c.head_dim, L)
    for m in (r for r in sizes if r <= GEMV_MAX_ROWS):
        if (kept := timings.get("fused", (m, *shape))) is None:
            rows = padding_rows(model, m)
            kept = [gpu_us(model.gpu, lambda fused=fused: [
                        (model.project_qkv(i, m, fused, rows), model.finish_layer(i, m, fused))
                        for i in range(L)]) / L for fused in (False, True)]
            timings.put("fused", (m, *shape), kept)
        times[m] = tuple(kept)
        if kept[1] < kept[0]:
            model.fused_sizes.add(m)
    model.gemv_shapes = {key: warps for key, warps in model.gemv_shapes.items() if key[0] in model.fused_sizes}
    return times


def pick_head(model, timings: GemmTimings) -> dict[int, tuple[float, float]]:
    """For each size in model.fused_sizes (after pick_fused): the GPU time of a step's end over that many greedy
    rows, from the residual stream to the sampled ids, as separate kernels (the final norm, the row gather,
    cuBLAS's LM head, the sampler reading the logits) and as one GEMV (gemv_norm_head: the norm, the LM head and
    the argmax; the row gather before it, the sampler copying its ids after), or as `timings` kept it.
    model.head_sizes gets the sizes where the one GEMV took less. Returns M -> (separate us, one GEMV us)."""
    times = {}
    V, H = model.weights.lm_head.shape
    for m in sorted(model.fused_sizes):
        if (kept := timings.get("head", (m, V, H))) is None:
            padding_rows(model, m)
            rows, zeros = (model.gpu.to_device(np.arange(m, dtype=np.int32) * k) for k in (1, 0))
            model.gpu.fill_bytes(model.sampling, 0)     # every seq_slot greedy: none is admitted before capture

            def tail(one_gemv: bool) -> None:
                model.head_sizes = {m} if one_gemv else set()
                model.final_logits(m, m, rows, fused=True)
                model.queue_sample_rows(m, zeros, zeros)
            kept = [gpu_us(model.gpu, lambda one_gemv=one_gemv: tail(one_gemv)) for one_gemv in (False, True)]
            timings.put("head", (m, V, H), kept)
        times[m] = tuple(kept)
    model.head_sizes = {m for m, (apart, one) in times.items() if one < apart}
    return times


def padding_rows(model, m: int) -> tuple:
    """Zeros in the first m rows of every buffer a timed GEMM reads (no NaN or Inf in the timing: x's norm is 0),
    and the (positions, slot_mapping) of m padding rows: position 0, no cache slot (nothing written)."""
    for buf in ("x", "h", "d", "attn", "act"):
        model.gpu.fill_bytes(model.row_view(getattr(model, buf), 0, m), 0)
    return model.gpu.to_device(np.zeros(m, np.int32)), model.gpu.to_device(np.full(m, -1, np.int32))


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes to capture: the ladder up to max_num_seqs, and max_num_seqs itself."""
    return [s for s in CAPTURE_SIZES if s < max_num_seqs] + [max_num_seqs]


def graph_size(rows: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds `rows` rows (None: more rows than any)."""
    return next((s for s in sizes if s >= rows), None)


def decode_layout(size: int) -> dict[str, tuple[int, int]]:
    """Where each input of a `size`-row graph lives in the inputs buffer: name -> (first int32, count). The
    fields in FIELDS order, then keys_per_split, then the block-table updates (not read by the graph)."""
    layout, at = {}, 0
    for name, width, _ in FIELDS:
        layout[name] = (at, width * size)
        at += width * size
    layout["keys_per_split"] = (at, 1)
    layout["updates"] = (at + 1, 0)
    return layout


def is_decode_step(step: StepInputs) -> bool:
    """True when every row is a decode row, a chunk of one row whose logits choose a token."""
    R = step.num_rows
    return R > 0 and len(step.spans) == R and len(step.logit_rows) == R


def pack_decode(step: StepInputs, size: int, keys_per_split: int) -> np.ndarray:
    """A decode step's inputs in decode_layout(size), padded to `size` rows, then its block-table updates:
    one int32 array, one copy. Padding rows: token 0, position 0, slot -1 (nothing written), their own logit
    row, seq_slot 0, counter 0, its token not the step before's (prev_rows -1), and a one-row tile of seq_slot 0
    at position 0."""
    R, rows = step.num_rows, np.arange(size, dtype=np.int32)
    pad_tiles = np.stack([rows, np.ones_like(rows), np.zeros_like(rows), np.zeros_like(rows)], 1)
    pad_tiles[:R] = step.spans                        # a decode row's span is its tile: row, 1, seq_slot, position
    real = {"tokens": step.tokens, "positions": step.positions, "slot_mapping": step.slot_mapping,
            "logit_rows": None, "logit_seq_slots": step.logit_seq_slots, "counters": step.counters,
            "prev_rows": step.prev_rows if step.prev_rows is not None else -1}
    parts = []
    for name, width, pad in FIELDS:
        if name == "logit_rows":
            parts.append(rows)                        # row r's logits are row r: decode rows all sample
        elif name == "tiles":
            parts.append(pad_tiles.reshape(-1))
        else:
            col = np.full(size, pad, np.int32)
            col[:R] = real[name]
            parts.append(col)
    parts += [np.array([keys_per_split], np.int32), step.table_updates.reshape(-1).astype(np.int32)]
    return np.concatenate(parts)


class DecodeGraphs:
    def __init__(self, model, sizes: list[int] | None = None):
        self.model, self.gpu = model, model.gpu
        self.sizes = sizes or capture_sizes(model.max_num_seqs)
        c, k = model.config, model.kernels
        self.keys = model.max_model_len                 # the most keys a row attends to
        self.n_splits = {s: decode_split(s, self.keys, c.num_key_value_heads, k.sms, model.partial_rows)[0]
                         for s in self.sizes}
        self.graphs: dict = {}
        self.capture_s, self.graph_bytes = 0.0, 0
        self.timed_now, self.timings_file = 0, None     # GEMM shapes timed by this engine; where the times are kept
        self.gemm_us: dict[tuple[str, int], tuple] = {}   # (name, M) -> cuBLAS us, plain gemv us, its warps,
        #                                                    fused gemv us, its warps (pick_gemms)
        self.fused_us: dict[int, tuple[float, float]] = {}   # M -> a layer's unfused us, fused us (pick_fused)
        self.head_us: dict[int, tuple[float, float]] = {}    # M -> a step's end apart, in one GEMV (pick_head)

    # ------------------------------------------------------------------ at start
    def _views(self, size: int):
        """The device views run_rows() and the sampler read, in the layout of `size` rows."""
        layout, at = decode_layout(size), self.model.inputs.view
        view = {name: at(4 * first, (count // width, width) if width > 1 else (count,))
                for (name, width, _), (first, count) in zip(FIELDS, layout.values())}
        split = (self.n_splits[size], at(4 * layout["keys_per_split"][0], (1,)))
        inputs = (view["tokens"], view["positions"], view["slot_mapping"], view["logit_rows"], None, view["tiles"],
                  split, None, view["prev_rows"])
        return inputs, view["logit_seq_slots"], view["counters"]

    def body(self, size: int) -> None:
        """What a graph of `size` rows holds: the forward over the padded rows, then the sampler."""
        inputs, seq_slots, counters = self._views(size)
        self.model.run_rows(size, size, inputs)
        self.model.queue_sample_rows(size, seq_slots, counters)

    def capture(self) -> None:
        """Pick each small GEMM's kernel (pick_gemms), then capture a graph for every size, largest first, each
        after one eager run of the same work (cuBLAS and the launch configurations set themselves up outside the
        capture), on inputs of padding rows only."""
        t0 = time.perf_counter()
        timings = GemmTimings.for_model(self.model, GEMV_COLUMN_WARPS, GEMV_PAIRED_MAX_WARPS)
        self.gemm_us = pick_gemms(self.model, self.sizes, timings)
        self.fused_us = pick_fused(self.model, self.sizes, timings)
        self.head_us = pick_head(self.model, timings)
        self.timed_now, self.timings_file = len(timings.new), timings.path
        timings.save()
        free0, _ = self.gpu.memory()
        empty = StepInputs(*[np.zeros(0, np.int32)] * 7, np.zeros((0, 4), np.int32), np.zeros((0, 2), np.int32))
        for size in sorted(self.sizes, reverse=True):
            self.model.copy_in(self.model.inputs, pack_decode(empty, size, self.keys))
            self.body(size)
            self.graphs[size] = self.gpu.capture(lambda size=size: self.body(size))
        self.gpu.sync()
        free1, _ = self.gpu.memory()
        self.capture_s, self.graph_bytes = time.perf_counter() - t0, free0 - free1

    # ------------------------------------------------------------------ each step
    def keys_per_split(self, size: int, max_keys: int) -> int:
        """The split for a step whose longest row attends to max_keys keys: decode_split()'s, widened where its
        splits would outnumber the captured grid's (whole 32-key tiles, as decode_split() makes them)."""
        m = self.model
        wanted = decode_split(size, max_keys, m.config.num_key_value_heads, m.kernels.sms, m.partial_rows)[1]
        return max(wanted, 32 * -(-max_keys // (32 * self.n_splits[size])))

    def launch(self, step: StepInputs, replay: bool = True) -> int | None:
        """Queue a decode step: its inputs' copy, the block-table updates, and the graph's replay (or, with
        replay=False, the same work launched eagerly: for tests). Returns the size it ran at, or None (not a
        decode step, or more rows than any graph)."""
        size = graph_size(step.num_rows, self.sizes) if is_decode_step(step) else None
        if size is None:
            return None
        m = self.model
        m.check_step(step)
        m.upload_params()                              # a sequence admitted with a one-token prompt decodes at once
        m.copy_in(m.inputs, pack_decode(step, size, self.keys_per_split(size, int(step.positions.max()) + 1)))
        u = len(step.table_updates)
        if u:
            first = decode_layout(size)["updates"][0]
            m.kernels.block_table_write(m.block_tables, m.inputs.view(4 * first, (u, 2)))
        if replay:
            self.graphs[size].launch()
        else:
            self.body(size)
        return size
