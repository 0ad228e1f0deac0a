"""The continuous-batching loop, vLLM's LLMEngine shape: requests in, one planned forward a step, tokens out.

    add_request(prompt, params, request_id=None) -> id     validated at once; queued (WAITING)
    step() -> list[RequestOutput]                           schedule, pack, run the forward, record the tokens
    abort_request(id)                                       frees its seq_slot and blocks now; an unknown id is
                                                            a no-op
    has_unfinished_requests()
    generate(prompts, params) / stream(prompt, params)      built on the four above

The loop knows nothing of the GPU: a runner does the forward (`runner.admit(seq)` writes a newly admitted
sequence's sampling parameters into its seq_slot; `runner.launch(step_inputs)` queues the packed rows and returns
a handle whose result() is the sampled token of every logit row). The GPU runner is the model;
tests/test_llm_engine_cpu.py drives this loop with a numpy runner on the CPU.

Asynchronous scheduling (async_scheduling=True, vLLM's name): a step plans, packs and launches step t+1, then
reads step t's ids back and records them, so the host's work overlaps the GPU's instead of following it:

    sync:   schedule(t) pack launch(t) advance(t) wait-ids(t) record(t) | schedule(t+1) ...   the GPU idle
                                                                                              from record(t)
    async:  advance(t) schedule(t+1) pack launch(t+1) wait-ids(t) record(t) | advance(t+1) ...  to launch(t+1)

advance() gives each sequence of the launched step a placeholder token (scheduler.py) that names where its id
will be on the GPU; the next step's row reads it there (packing.StepInputs.prev_rows). step() returns the
outputs of step t, so every output comes one step later than the forward that chose it; between two calls no
sequence holds a placeholder. The price: a sequence that stops on a stop token at step t has had a row of
step t+1 computed for nothing (one that stops by length is never given that row), and every stopped sequence
frees its seq_slot and blocks at record(t), after step t+1 was planned, so a waiting request takes them a step
later.
"""
from __future__ import annotations

import enum
import itertools
import secrets
import time
from dataclasses import replace
from typing import NamedTuple

from common.outputs import RequestOutput, Timing
from common.prompts import PromptError, PromptPreparer
from common.sampling import SamplingParams

from .block_manager import BlockManager, blocks_for
from .scheduler import Scheduler, SchedulerOutput, SchedulerStats
from .sequence import Sequence


class Report(enum.Enum):
    """How step() reports a request that is not streamed as text."""

    FINAL_ONLY = "final only"          # once, when it finishes, with all its text
    TOKEN_IDS = "token ids"            # every step, token ids only


FINAL_ONLY, TOKEN_IDS = Report.FINAL_ONLY, Report.TOKEN_IDS


class Ready:
    """A step's sampled ids already on the host: the result() of a runner whose launch() waits."""

    def __init__(self, ids):
        self.ids = ids

    def result(self):
        return self.ids


class Launched(NamedTuple):
    """A step handed to the runner and not yet recorded."""

    plan: SchedulerOutput
    ids: object                        # the runner's handle: ids.result() waits for the sampled ids
    prompt_rows: int                   # for the wait's account: a wait is counted for the step it waited for


class LLMEngine:
    def __init__(self, runner, prompts: PromptPreparer, max_num_seqs: int, max_num_batched_tokens: int,
                 blocks: BlockManager, async_scheduling: bool = False):
        self.runner, self.prompts, self.tokenizer = runner, prompts, prompts.tokenizer
        self.max_model_len = prompts.max_model_len
        self.blocks = blocks
        self.scheduler = Scheduler(max_num_seqs, max_num_batched_tokens, blocks, self.max_model_len)
        self.async_scheduling = async_scheduling
        self._in_flight: Launched | None = None   # async: the step launched by the last step() call
        self._auto_ids = itertools.count()
        self._live: dict = {}          # request id -> how step() reports it: its text stream (a DetokenizeStream),
        #                                FINAL_ONLY, or TOKEN_IDS (no text: the caller detokenises)
        self._per_step = 0             # of which reported every step (not FINAL_ONLY)
        self.timings: list[Timing] = []   # generate() / stream(): each request's, in prompt order

    # ------------------------------------------------------------------ the step API
    def add_request(self, prompt, params: SamplingParams, request_id=None, detokenize: bool = True):
        """Validate and queue one request; returns its id. A bad prompt, params or id raises here, and the
        engine is left as it was. detokenize=False (vLLM's SamplingParams.detokenize): step() gives its token
        ids and no text, for a caller that detokenises elsewhere (the server, off the engine's thread)."""
        return self._add(prompt, params, request_id, TOKEN_IDS if not detokenize else None).request_id

    def _add(self, prompt, params: SamplingParams, request_id, kind=None) -> Sequence:
        """kind FINAL_ONLY (vLLM's RequestOutputKind.FINAL_ONLY, which its generate() uses): step() reports the
        request once, when it finishes, with its text decoded then; no text is streamed token by token."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, not {type(params).__name__}")
        ids = self.prompts.encode(prompt)
        if request_id is None:
            request_id = f"req-{next(self._auto_ids)}"
        if request_id in self._live:
            raise ValueError(f"request_id {request_id!r} is already in use")
        # the most positions it will cache: all but its last token, whose K/V are never computed
        positions = min(len(ids) + params.max_tokens - 1, self.max_model_len - 1)
        need, pool = blocks_for(positions, self.blocks.block_size), self.blocks.num_blocks
        if need > pool:                            # it could never run, even alone: refuse it now, not later
            raise PromptError(f"request of {len(ids)} prompt tokens and max_tokens={params.max_tokens} needs "
                             f"{need} KV cache blocks of {self.blocks.block_size} positions ({positions} "
                             f"positions) and the cache holds {pool}: lower max_tokens, or give the engine more "
                             "KV cache memory")
        seed = params.seed if params.seed is not None else secrets.randbits(64)
        seq = Sequence(request_id, ids, params, self.prompts.stop_ids(params), seed, Timing(len(ids)))
        self._live[request_id] = kind = kind or self.tokenizer.stream()
        self._per_step += kind is not FINAL_ONLY
        self.scheduler.add(seq)
        return seq

    def abort_request(self, request_id) -> None:
        if self.scheduler.abort(request_id) is not None:
            self._forget(request_id)

    def has_unfinished_requests(self) -> bool:
        """Requests waiting or running, or a step still to record (its requests may have stopped, but step()
        must read its ids back before the engine is idle)."""
        return self.scheduler.has_unfinished() or self._in_flight is not None

    def num_requests(self) -> tuple[int, int]:
        """(running, waiting): running requests hold a seq_slot each."""
        return len(self.scheduler.running), len(self.scheduler.waiting)

    def kv_cache_usage(self) -> float:
        """The share of the KV cache's blocks held by running requests."""
        return self.blocks.usage()

    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        if self._in_flight is not None:            # async: the step launched by the last call, not yet recorded
            self.scheduler.advance(self._in_flight.plan)   # placeholders, for schedule() to plan the rows after
        plan = self.scheduler.schedule()
        launched = None
        if plan:
            for s in plan.admitted:                # (re)admitted in this schedule(): its parameters
                self.runner.admit(s)
            launched = Launched(plan, self.runner.launch(self.scheduler.batch.prepare(plan)),
                                self.scheduler.stats.prefill_rows[-1])
        if self.async_scheduling:                  # record the step before while this one runs
            done, self._in_flight = self._in_flight, launched
        elif launched:
            done = launched
            self.scheduler.advance(plan)
        else:
            done = None
        t1 = time.perf_counter()
        sampled = done.ids.result() if done else None   # returns when the GPU is done with that step
        t2 = time.perf_counter()
        outs = self._record(done.plan, sampled) if done else []
        flushed = 0.0                              # a wait for the GPU after t2, counted with the forward's
        if self._in_flight is not None and not self.scheduler.has_unfinished():
            t3 = time.perf_counter()
            self._in_flight.ids.result()           # every row of it is of stopped requests: nothing to record
            self._in_flight, flushed = None, time.perf_counter() - t3
        # the host's share of the step, all but the wait: without async scheduling the GPU sits idle through it
        # (plan, pack, record, detokenise); with it, most of it runs while the GPU works on the step launched here
        if done or launched:
            stats = self.scheduler.stats
            stats.host_s.append(time.perf_counter() - t2 + t1 - t0 - flushed)
            stats.forward_s.append(t2 - t1 + flushed)
            stats.forward_prefill_rows.append(done.prompt_rows if done else 0)   # the wait is `done`'s
        return outs

    def _record(self, plan, sampled) -> list[RequestOutput]:
        """Record a step's sampled ids and build the outputs its callers asked for: with only final-only
        requests running (generate()), the finished ones alone."""
        outs, advanced = [], self.scheduler.record(plan, sampled)
        if self._per_step == 0:
            advanced = [s for s in advanced if s.finish_reason is not None]
        for seq in advanced:
            text = self._live[seq.request_id]
            if text is TOKEN_IDS:                  # the caller detokenises
                if seq.finished:
                    self._forget(seq.request_id)
                outs.append(RequestOutput(seq.request_id, seq.prompt, seq.new, "", seq.finish_reason,
                                          [seq.new[-1]], "", seq.num_cached_tokens))
                continue
            if text is FINAL_ONLY:                 # nothing until it finishes, then all its text
                if seq.finished:
                    self._forget(seq.request_id)
                    text = self.tokenizer.decode(seq.new)
                    outs.append(RequestOutput(seq.request_id, seq.prompt, seq.new, text, seq.finish_reason,
                                              seq.new, text, seq.num_cached_tokens))
                continue
            delta = text.step(seq.new[-1])
            if seq.finished:                       # the last delta flushes a held-back partial character
                delta += text.finish(seq.new)
                self._forget(seq.request_id)
            # token_ids is the sequence's own list, which later steps extend (copy it to keep a snapshot): a copy
            # of every running request's tokens at every step is O(tokens) of host time the GPU would wait for
            outs.append(RequestOutput(seq.request_id, seq.prompt, seq.new, text.text, seq.finish_reason,
                                      [seq.new[-1]], delta, seq.num_cached_tokens))
        return outs

    def _forget(self, request_id) -> None:
        """The request is over: step() reports it no more."""
        if self._live.pop(request_id) is not FINAL_ONLY:
            self._per_step -= 1

    # ------------------------------------------------------------------ built on it
    def generate(self, prompts, params: SamplingParams | list[SamplingParams]) -> list[RequestOutput]:
        """Every prompt to completion; outputs in prompt order. Every prompt is validated before any runs."""
        requests = self.prompts.requests(prompts, params)
        self.scheduler.stats = SchedulerStats()    # this call's counters
        seqs = [self._add(p, sp, None, FINAL_ONLY) for p, sp in requests]
        self.timings = [s.timing for s in seqs]
        ids = [s.request_id for s in seqs]
        done: dict = {}
        while len(done) < len(ids) and self.has_unfinished_requests():
            for out in self.step():
                if out.finished:
                    done[out.request_id] = out
        return [replace(done[rid], request_id=i) for i, rid in enumerate(ids)]   # ids as every stage's: 0..n-1

    def stream(self, prompt, params: SamplingParams):
        """Yield (token id, finish reason or None) as each new token of one request is chosen."""
        self.scheduler.stats = SchedulerStats()
        seq = self._add(prompt, params, None)
        self.timings, rid = [seq.timing], seq.request_id
        while rid in self._live:                   # an abort from elsewhere ends the stream
            for out in self.step():
                if out.request_id == rid:
                    yield out.new_token_ids[0], out.finish_reason
                    if out.finished:
                        return
