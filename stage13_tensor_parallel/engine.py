"""The engine: continuous batching. Requests join and leave the running set at every step.

    add_request(prompt, params) -> id     queued at once (WAITING)
    step():   the scheduler plans one forward: a decode row for every running sequence, then prompt chunks
              (of running sequences still prefilling, then of newly admitted ones) within the token budget;
              the rows are packed with no padding, run, and each sampled with its own seq_slot's parameters
              a finished sequence frees its seq_slot and its blocks at once, for a waiting request
    generate() / stream()                 built on the two, as every stage's

The KV cache is paged: a pool of blocks of block_size positions (cache.py), handed out by the block manager as
sequences grow (block_manager.py); the scheduler admits by blocks and preempts when they run out. The pool is
sized from the GPU memory left once the weights and the activations are allocated (measured), as vLLM sizes it
after its profile run, or from num_gpu_blocks / kv_cache_memory_bytes when given.
Decode steps replay CUDA graphs captured at start, one per batch size of a ladder (graphs.py); enforce_eager
(vLLM's name) turns them off. The host plans each step while the GPU runs the one before (async_scheduling,
llm_engine.py). The loop is llm_engine.py; the GPU under it is runner.py over model.py.
tensor_parallel_size=N (vLLM's name) splits every layer over N GPUs (tensor_parallel.py): this process is rank 0,
with the loop, the scheduler and GPU 0; ranks 1..N-1 are processes of their own (ranks.py, worker.py), each
launching every step rank 0 sends it on its own GPU, the ranks meeting in NCCL collectives (communicator.py).
"""
from __future__ import annotations

import contextlib
import gc
import sys
import weakref

import numpy as np

from common.checkpoint import Checkpoint
from common.device import DeviceArray, get_gpu, gpu_count
from common.outputs import RequestOutput
from common.prompts import PromptPreparer
from common.sampling import SamplingParams
from common.synthetic import resolve_model

from .block_manager import BlockManager, blocks_for
from .cache import BLOCK_SIZE, MAX_NUM_SEQS, check_block_size, check_count, kv_cache_bytes, plan_num_blocks
from .communicator import unique_id
from .graphs import DecodeGraphs
from .kernels import Kernels
from .llm_engine import LLMEngine, Ready
from .model import Model
from .packing import StepInputs
from .ranks import Ranks
from .runner import GpuRunner
from .sequence import Sequence
from .tensor_parallel import plan, rank_config
from .weights import load_weights, verify
from .worker import RankedRunner, Split, Worker, shard_part

MAX_NUM_BATCHED_TOKENS = 2048      # rows per forward, the token budget. The 1B's GEMMs are compute-bound well
#                                    before it; a larger budget costs activation rows (attention has no scratch
#                                    any more) and lengthens the steps that carry prompt chunks


def check_sizes(max_num_seqs: int | None, max_num_batched_tokens: int | None, block_size: int
                ) -> tuple[int, int, int]:
    """(max_num_seqs, max_num_batched_tokens, block_size) with the defaults filled in; a value out of range is a
    ValueError naming it."""
    B = check_count("max_num_seqs", MAX_NUM_SEQS if max_num_seqs is None else max_num_seqs)
    tokens = check_count("max_num_batched_tokens", max(MAX_NUM_BATCHED_TOKENS, B) if max_num_batched_tokens is None
                         else max_num_batched_tokens)
    if tokens < B:
        raise ValueError(f"max_num_batched_tokens={tokens} must be >= max_num_seqs={B}: each running "
                         "sequence decodes one row per step")
    return B, tokens, check_block_size(block_size)


class Engine:
    ranks: Ranks | None = None      # the other ranks' processes, where the model is split over GPUs

    def __init__(self, model: str, max_model_len: int | None = None, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None, gpu_memory_utilization: float = 0.9,
                 block_size: int = BLOCK_SIZE, num_gpu_blocks: int | None = None,
                 kv_cache_memory_bytes: int | None = None, enforce_eager: bool = False,
                 async_scheduling: bool = True, enable_prefix_caching: bool = True,
                 tensor_parallel_size: int = 1, progress: bool = False):
        self.folder = resolve_model(model)
        self.checkpoint = Checkpoint(self.folder)          # every validation error is raised here, before the GPU
        self.config = self.checkpoint.config
        N = tensor_parallel_size
        self.shard = plan(self.config, N)[0]               # a size that cannot split the model: refused here too
        if N > 1 and gpu_count() < N:
            raise ValueError(f"tensor_parallel_size={N} needs {N} GPUs; this machine has {gpu_count()}")
        self.prompts = PromptPreparer(self.folder, self.config, max_model_len)
        self.tokenizer = self.prompts.tokenizer
        self.max_model_len = L = self.prompts.max_model_len
        B, tokens, bs = check_sizes(max_num_seqs, max_num_batched_tokens, block_size)
        self.max_num_seqs, self.block_size = B, bs
        gc.collect()        # an engine dropped but not yet collected would hold its pool, read below as in use
        self.gpu = get_gpu()
        self.kernels = Kernels(self.gpu)
        self.ranks, comm, part = None, None, None
        if N > 1:           # the other ranks load their shards while this one loads its own
            part = shard_part(self.config, self.shard)
            self.ranks = Ranks(N, Worker, (self.folder, L, B, tokens, bs))
            self.split = Split(self.ranks)
            self._stop = weakref.finalize(self, self.split.stop)   # dropped or failed: every rank stopped
        self.weights = load_weights(self.checkpoint, self.gpu, progress=progress, part=part,
                                    vocab=self.shard.vocab if N > 1 else None)
        if self.ranks is not None:
            self.ranks.ready()
            uid = unique_id()
            self.ranks.send_call("join", uid)
            comm = self.split.join(uid, self.gpu)    # returns once every rank has joined
            self.ranks.replies()
        before, _ = self.gpu.memory()
        self.model = Model(self.weights, rank_config(self.config, self.shard), self.gpu, self.kernels, B, L, tokens,
                           bs, comm)
        free, total = self.gpu.memory()              # the activations' peak, measured: the forward allocates nothing
        num_blocks = plan_num_blocks(self.model.config, bs, total, total - free, gpu_memory_utilization,
                                     num_gpu_blocks, kv_cache_memory_bytes)
        if self.ranks is not None:
            self.ranks.call("allocate", num_blocks)
        self.model.allocate_cache(num_blocks)
        gib = kv_cache_bytes(self.model.config, num_blocks * bs) / 2**30
        print(f"kv cache   {num_blocks:,} blocks x {bs} positions = {gib:.2f} GiB{' a rank' if N > 1 else ''}; "
              f"{num_blocks / blocks_for(L, bs):.1f} sequences of max_model_len={L} at once (up to max_num_seqs={B} "
              f"shorter ones; activations {(before - free) / 2**30:.2f} GiB measured, token budget {tokens} rows a "
              "step)", file=sys.stderr)
        rows = self.model.tile_rows
        print("attention  prompts " + (f"in tiles of {rows} rows through attention_hopper.cu (wgmma, TMA: sm_90a)"
                                       if self.model.hopper else f"in tiles of {rows} rows through attention_tiles.cu"
                                       if rows else "row by row through attention_rows.cu"), file=sys.stderr)
        self.graphs = None if enforce_eager else DecodeGraphs(self.model)
        if self.graphs is not None and self.ranks is not None:   # rank 0 picks; all capture together
            self.graphs.pick()
            self.ranks.send_call("capture", self.graphs.picks())
            self.graphs.capture(self.graphs.picks())
            self.ranks.replies()
            self.split.check()
        elif self.graphs is not None:                # after the cache: the graphs hold its address
            self.graphs.capture()
        if self.graphs is not None:
            g = self.graphs
            print(f"cuda graphs {len(g.sizes)} decode batch sizes {g.sizes[0]}..{g.sizes[-1]} captured in "
                  f"{g.capture_s:.2f} s, {g.graph_bytes / 2**20:.1f} MiB; GEMMs timed now: {g.timed_now} of "
                  f"{len(g.gemm_us)}, the others as timed before on this machine ({g.timings_file})",
                  file=sys.stderr)
            plain = [f"{name} M={m} ({t[0]:.1f} -> {t[1]:.1f} us)" for (name, m), t in g.gemm_us.items()
                     if (m, *self.model.layers[0][name].shape) in self.model.plain_shapes]
            print(f"gemv       unfused GEMMs through gemv.cu's plain GEMV where faster than cuBLAS, {len(plain)} of "
                  f"{len(g.gemm_us)}: {', '.join(plain) or 'none'}", file=sys.stderr)
            fused = [f"M={m} ({unfused:.1f} -> {mine:.1f} us a layer)" for m, (unfused, mine) in g.fused_us.items()
                     if m in self.model.fused_sizes]
            print(f"gemv       fused layers (norms, SwiGLU, residual adds in gemv.cu) where faster than unfused, for "
                  f"{len(fused)} of {len(g.fused_us)} sizes: {', '.join(fused) or 'none'}", file=sys.stderr)
            head = [f"M={m} ({apart:.1f} -> {one:.1f} us)" for m, (apart, one) in g.head_us.items()
                    if m in self.model.head_sizes]
            print(f"gemv       the final norm, LM head and greedy argmax in one GEMV where faster than apart, for "
                  f"{len(head)} of {len(g.head_us)} fused sizes: {', '.join(head) or 'none'}", file=sys.stderr)
        runner = GpuRunner(self.model, self.graphs)
        if self.ranks is not None:
            runner = RankedRunner(runner, self.split)
            print(f"tensor parallel: {N} ranks (GPUs 0-{N - 1}), {len(self.shard.heads)} query heads, "
                  f"{len(self.shard.kv_heads)} K/V heads and {len(self.shard.mlp):,} MLP columns a rank; "
                  f"{2 * self.config.num_hidden_layers} all-reduces and an all-gather a step", file=sys.stderr)
        self.llm = LLMEngine(runner, self.prompts, B, tokens, BlockManager(num_blocks, bs, enable_prefix_caching),
                             async_scheduling)

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

    def prefix_cache_stats(self) -> tuple[int, int]:
        """(prompt tokens looked up in the prefix cache, tokens found) over the requests' first admissions so far:
        vLLM's prefix_cache_queries and prefix_cache_hits."""
        return self.llm.blocks.query_tokens, self.llm.blocks.hit_tokens

    def prefix_cache_hit_rate(self) -> float:
        """The share of prompt tokens found in the prefix cache at their requests' first admission, so far."""
        queries, hits = self.prefix_cache_stats()
        return hits / queries if queries else 0.0

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (vLLM's name): later requests compute their prefixes again (benchmarks start
        each run cold). Refused while requests run."""
        if self.llm.has_unfinished_requests():
            raise RuntimeError("reset_prefix_cache() needs an engine with no unfinished requests")
        self.llm.blocks.reset_cache()

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
        """Names of tensors whose GPU bytes differ from the file's, or from this rank's part of it ("rank r: name"
        for the other ranks'; empty list: all identical)."""
        mine = verify(self.weights, self.checkpoint, self.kernels, shard_part(self.config, self.shard)
                      if self.ranks is not None else None)
        theirs = self.ranks.call("verify") if self.ranks is not None else []
        return mine + [f"rank {r}: {name}" for r, names in enumerate(theirs, start=1) for name in names]

    def close(self) -> None:
        """Stop the other ranks' processes and free the communicator (an engine on one GPU has neither); also done
        when the engine is dropped."""
        if self.ranks is not None:
            self._stop()

    def _forward(self, step: StepInputs, logits: DeviceArray | None = None) -> None:
        """model.forward outside the loop, on every rank (the others' logits into scratch buffers)."""
        if self.ranks is not None:
            self.split.check()
            self.ranks.send("forward", step, 0 if logits is None else logits.shape[0])
        self.model.forward(step, logits)

    def _to_host(self, arr: DeviceArray) -> np.ndarray:
        """gpu.to_host, then the ranks checked: a wait that a failed rank's abort ended gives no true values."""
        host = self.gpu.to_host(arr)
        if self.ranks is not None:
            self.split.check()
        return host

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
        `chunk` rows (default: the token budget), each chunk over the keys the ones before it cached. Its
        blocks come from the pool and go back to it at the end."""
        self._require_idle()
        ids = np.asarray(self.prompts.encode(list(token_ids)), np.int32)
        chunk = chunk or self.model.max_rows
        out = self.gpu.empty((len(ids), self.config.vocab_size), "f32")
        with self.borrowed_blocks(len(ids)) as table:
            for first in range(0, len(ids), chunk):
                pos = np.arange(first, min(first + chunk, len(ids)), dtype=np.int32)
                zeros = np.zeros(len(pos), np.int32)
                spans = np.array([[0, len(pos), 0, first]], np.int32)              # one chunk, seq_slot 0
                step = StepInputs(ids[pos], pos, table[pos // self.block_size] * self.block_size
                                  + pos % self.block_size, zeros, pos - first, zeros, zeros, spans,
                                  _table_entries(table) if first == 0 else np.zeros((0, 2), np.int32))
                self._forward(step, self.model.row_view(out, first, len(pos)))
        return self._to_host(out)

    @contextlib.contextmanager
    def borrowed_blocks(self, positions: int):
        """Blocks for `positions` positions of one sequence in seq_slot 0, taken from the pool for the `with`
        and given back after it (for logits() and tests that drive the model directly; the engine must be
        idle). Yields the block table as an int32 array."""
        self._require_idle()
        holder = Sequence("borrowed", [], SamplingParams(), frozenset(), 0, None)
        self.llm.blocks.grow(holder, positions)
        try:
            yield np.array(holder.block_table, np.int32)
        finally:
            self.llm.blocks.free(holder)

    def decode_logits(self, sequences, n_prompts) -> list[np.ndarray]:
        """Run sequences[b][:n_prompts[b]] as requests together, then decode the rest of each teacher-forced
        (its given tokens, not sampled ones); per sequence, the logits (len - n_prompt + 1, V) f32 that chose
        each following token (for tests against a full recompute)."""
        self._require_idle()
        forced = _TeacherForced(self, sequences)
        loop = LLMEngine(forced, self.prompts, self.max_num_seqs, self.model.max_rows, self.llm.blocks)
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

    def __init__(self, engine: Engine, sequences):
        super().__init__(engine.model)
        self.engine, self.sequences, self.loop = engine, sequences, None
        self.logits = {b: [] for b in range(len(sequences))}

    def admit(self, seq) -> None:
        pass                                        # nothing is sampled

    def launch(self, x: StepInputs) -> Ready:
        self.engine._forward(x)
        n = len(x.logit_rows)
        logits = self.engine._to_host(self.model.row_view(self.model.logits, 0, n)) if n else []
        by_slot = {s.seq_slot: s for s in self.loop.scheduler.running}
        chosen = []
        for row, slot in zip(logits, x.logit_seq_slots):
            s = by_slot[int(slot)]
            self.logits[s.request_id].append(row)
            given = self.sequences[s.request_id]
            chosen.append(given[s.length] if s.length < len(given) else 0)
        return Ready(np.array(chosen, np.int32))


def _table_entries(table: np.ndarray) -> np.ndarray:
    """Block-table updates (index, block) writing `table` into seq_slot 0's row of the device's tables."""
    return np.stack([np.arange(len(table), dtype=np.int32), table], 1)
