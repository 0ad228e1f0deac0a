"""The generated parts of this stage's chapter (README.md); `python -m common.readme` renders them with the common,
data-driven ones.

  hash-chain      the worked example's sequences as chains of blocks, each full block above the first 8 hex
                  digits of its hash (sha256 of its parent's hash and its own token ids)
  worked-example  four requests through scheduler.py and block_manager.py on the CPU (block_size 4): each block of
                  each request, its hash, whether it was found in the cache or computed, the block that holds it
                  and its holders in the step that admitted three of them
  eviction        the same pool once the four have finished, then a fifth request that needs more blocks than the
                  pool holds free of cached K/V: where each of its blocks comes from, then what each earlier prompt
                  still finds
  prefix-plan     the `prefix` and `ragged` workloads' requests through this stage's scheduler at the engine's
                  defaults, with prefix caching off and on, tokens made up (no model): prompt rows computed, steps,
                  the step that gives each request its first token, blocks held
  measured        this stage against the previous one on `prefix`, `chat` and `ragged`, from the newest harness
                  run holding both, or the command that measures it
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from common.bench.workloads import WORKLOADS, make_requests
from common.course import results
from common.course.readme import RESULTS, ROOT
from common.outputs import Timing
from common.sampling import SamplingParams

from .block_manager import BlockManager, block_hashes, blocks_for
from .cache import BLOCK_SIZE, MAX_NUM_SEQS
from .engine import MAX_NUM_BATCHED_TOKENS
from .scheduler import Scheduler
from .sequence import Sequence

STAGE = Path(__file__).parent.name
PREVIOUS = max(p.name for p in ROOT.glob("stage[0-9][0-9]_*") if p.name < STAGE)
NN, PREV_NN = STAGE[5:7], PREVIOUS[5:7]


# ---------------------------------------------------------------------- the worked example (CPU, from the code)
BS, NUM_BLOCKS = 4, 12                                       # block_size and the pool of the example
PROMPTS = {"A": list(range(1, 13)),                          # 12 tokens: three full blocks
           "B": list(range(1, 9)) + [20, 21, 22, 23, 24],    # A's first 8 tokens, then its own 5
           "C": [99] + list(range(2, 9)) + [20, 21, 22, 23, 24],   # B's prompt but for its first token
           "D": list(range(1, 13))}                          # A's prompt again, whole
NEW = {"A": [31, 32, 33, 34, 35], "B": [41], "C": [51], "D": [61]}   # what "the GPU" samples for each
LATE = ("E", list(range(100, 128)))                          # after the four: 28 unrelated tokens, 7 blocks


def _seq(name: str, prompt: list[int], max_tokens: int = 1) -> Sequence:
    return Sequence(name, list(prompt), SamplingParams(max_tokens=max_tokens), frozenset(), 0, Timing(len(prompt)))


class Run(NamedTuple):
    seqs: dict[str, Sequence]
    pool: BlockManager
    tables: dict[str, list[int]]                 # each request's block table as it last held it
    holders: dict[int, list[str]]                # block -> the requests holding it in step 2
    writer: dict[int, tuple[str, int]]           # block -> (request, block index) that first wrote K/V into it
    chunks: dict[str, tuple[int, int]]           # step 2's prompt chunks: request -> (first position, rows)


def _run() -> Run:
    """A alone in step 1; B, C and D arrive after it and are admitted together in step 2; all run to their end
    (the synchronous loop: advance() then record() each step)."""
    pool = BlockManager(NUM_BLOCKS, BS)
    sched = Scheduler(4, 64, pool, 64)
    seqs = {name: _seq(name, p, len(NEW[name])) for name, p in PROMPTS.items()}
    ids = {name: iter(v) for name, v in NEW.items()}
    tables, holders, writer, chunks = {}, {}, {}, {}
    sched.add(seqs["A"])
    step = 0
    while sched.has_unfinished():
        step += 1
        plan = sched.schedule()
        if step == 2:
            holders = {b: [s.request_id for s in sched.running if b in s.block_table] for b in pool.refs}
            chunks = {c.seq.request_id: (c.start, c.n) for c in plan.prefill}
        for c in plan.chunks:                                # the blocks this step writes K/V into
            for i in range(c.start // BS, (c.start + c.n - 1) // BS + 1):
                writer.setdefault(c.seq.block_table[i], (c.seq.request_id, i))
        sched.advance(plan)
        tables |= {s.request_id: list(s.block_table) for s in sched.running}
        sched.record(plan, np.array([next(ids[s.request_id]) for s in plan.sampling_seqs], np.int32))
        if step == 1:
            for name in "BCD":
                sched.add(seqs[name])
    return Run(seqs, pool, tables, holders, writer, chunks)


def _hex(h: bytes) -> str:
    return h.hex()[:8]


def hash_chain() -> str:
    """Each sequence's computed positions (A's with the tokens it generated) as its chain of blocks."""
    lines = ["```"]
    for name, s in _run().seqs.items():
        n = s.num_computed
        hashes = [_hex(h) for h in block_hashes(s, BS, n)]
        cells = [" ".join(f"{t:>2}" for t in s.tokens(i, min(BS, n - i))) for i in range(0, n, BS)]
        lines.append(f"{name}  " + " -> ".join(f"[{c:<11}]" for c in cells))
        lines.append("    " + "".join(f" {h:<16}" for h in hashes + ["(partial)"] * (len(cells) - len(hashes))))
    lines.append("```")
    return "\n".join(line.rstrip() for line in lines)


def worked_example() -> str:
    """Every block each request held: found by its first admission's lookup, or computed, and then cached or not;
    with the block id and the requests holding it in step 2."""
    run = _run()
    pool, tables = run.pool, run.tables
    lines = ["| request | block | tokens | hash | found or computed | block id | held in step 2 by |",
             "|" + " --- |" * 7]
    for name, s in run.seqs.items():
        hashes = block_hashes(s, BS, s.num_computed)
        for i, b in enumerate(tables[name]):
            tokens = " ".join(map(str, s.tokens(i * BS, min(BS, s.num_computed - i * BS))))
            if i < s.num_cached_tokens // BS:
                what = "found"
            elif i >= len(hashes):
                what = "computed; partial, never cached"
            elif pool.cached.get(hashes[i]) == b:
                what = "computed, cached" + (" (filled by a decode row)" if (i + 1) * BS > len(s.prompt) else "")
            else:
                what = "computed; a copy, not cached"
            h = _hex(hashes[i]) if i < len(hashes) else "-"
            lines.append(f"| {name} | {i} | {tokens} | {h} | {what} | {b} | {', '.join(run.holders.get(b, ['-']))} |")
    (b0, bn), (c0, cn), (d0, dn) = (run.chunks[n] for n in "BCD")
    shared = ", ".join(map(str, tables["A"][:b0 // BS]))
    lines += ["", (
        f"A pool of {pool.num_blocks} blocks, a budget of 64 rows a step. B's first {b0 // BS} blocks are A's "
        f"blocks {shared}, so step 2 runs only B's positions {b0}-{b0 + bn - 1}. C differs in its first token, so "
        f"every hash of its chain differs and it runs positions {c0}-{c0 + cn - 1}. D's prompt is A's, every block "
        "of it cached, yet `lookup()` stops before the block of its last token: D runs positions "
        f"{d0}-{d0 + dn - 1} into block {tables['D'][-1]}, whose hash the cache holds already (A's block "
        f"{tables['A'][len(tables['D']) - 1]}), so this copy stays out of it. The pool's counters: "
        f"{pool.hit_tokens} of {pool.query_tokens} prompt tokens found ({pool.hit_tokens / pool.query_tokens:.0%}).")]
    return "\n".join(lines)


def _held(b: int, run: Run) -> str:
    """What block b holds: the request and block index that wrote it, and its hash while cached."""
    who, i = run.writer[b]
    hashes = run.seqs[who].block_hashes
    if i < len(hashes) and run.pool.cached.get(hashes[i]) == b:
        return f"{who}'s block {i}, cached as {_hex(hashes[i])}"
    return f"{who}'s block {i}, " + ("partial" if i >= len(hashes) else "a copy of a cached block")


def eviction() -> str:
    """Once the four have finished: the cached blocks in the order they would be evicted, E's blocks as grow()
    hands them out (checked against the order the docstring of block_manager.py gives), and what each earlier
    prompt finds afterwards."""
    run = _run()
    pool = run.pool
    order = [(b, "the free list, the last freed first", _held(b, run)) for b in reversed(pool._free)]
    order += [(b, "never used", "nothing") for b in range(pool._fresh, pool.num_blocks)]
    order += [(b, "evicted, the least recently freed cached block", _held(b, run)) for b in pool._evictable]
    lru = ", ".join(f"{b} ({run.writer[b][0]}{run.writer[b][1]})" for b in pool._evictable)
    name, prompt = LATE
    lines = [(f"Once the four have finished, all {pool.num_free} blocks of the pool are free and "
              f"{len(pool._evictable)} of them still cached; those, least recently freed first (request and block "
              f"index): {lru}. Then {name}, {len(prompt)} unrelated tokens, asks `grow()` for "
              f"{len(prompt) // BS} blocks:"), "",
             f"| {name}'s block | block id | taken from | what the block held |", "|" + " --- |" * 4]
    got = pool.grow(_seq(name, prompt), len(prompt))
    for i, (b, (expected, source, held)) in enumerate(zip(got, order)):
        assert b == expected, f"grow() took block {b}, where the order above has {expected}"
        lines.append(f"| {i} | {b} | {source} | {held} |")
    found = [f"{n} {len(pool.lookup(_seq(n, p)))} of {(len(p) - 1) // BS}" for n, p in PROMPTS.items()]
    lines += ["", (f"A new request with each earlier prompt would now find, in blocks: {', '.join(found)}. `free()` "
                   "lets go of a sequence's last block first, so a tail is evicted before the prefix it hangs from; "
                   "a block several requests hold joins the queue only when the last of them lets go.")]
    return "\n".join(lines)


# ---------------------------------------------------------------------- the workloads, planned on the CPU
def _plan(workload: str, enable: bool) -> dict:
    """A workload's requests through Scheduler.update() with every sampled token made up: what the GPU would be
    asked to compute. The pool holds every request whole, so nothing is preempted or evicted."""
    reqs = make_requests(workload)
    pool = BlockManager(sum(blocks_for(len(p) + sp.max_tokens, BLOCK_SIZE) for p, sp in reqs), BLOCK_SIZE, enable)
    sched = Scheduler(MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, pool, WORKLOADS[workload].max_model_len)
    for i, (prompt, params) in enumerate(reqs):
        sched.add(Sequence(i, prompt, params, frozenset(), 0, Timing(len(prompt))))
    steps, rows, first, held = 0, 0, {}, 0
    while sched.has_unfinished():
        plan = sched.schedule()
        steps += 1
        rows += sum(c.n for c in plan.prefill)
        held = max(held, pool.num_blocks - pool.num_free)
        for s in plan.sampling_seqs:
            first.setdefault(s.request_id, steps)
        sched.update(plan, np.zeros(len(plan.sampling_seqs), np.int32))
    return {"rows": rows, "steps": steps, "last_first": max(first.values()),
            "mean_first": sum(first.values()) / len(first), "held": held,
            "found": pool.hit_tokens / pool.query_tokens}


def prefix_plan() -> str:
    lines = ["| workload | prefix caching | prompt rows computed | steps | step of the last first token | mean step "
             "of a first token | blocks held at most | prompt tokens found |", "|" + " --- |" * 8]
    for w in ("prefix", "ragged"):
        off, on = _plan(w, False), _plan(w, True)
        for name, r in (("off", off), ("on", on)):
            lines.append(f"| `{w}` | {name} | {r['rows']:,} | {r['steps']:,} | {r['last_first']:,} | "
                         f"{r['mean_first']:.1f} | {r['held']:,} | {r['found']:.1%} |")
        if w == "prefix":
            lines.append(f"| | off / on | {off['rows'] / on['rows']:.1f}x | {off['steps'] / on['steps']:.2f}x | "
                         f"{off['last_first'] / on['last_first']:.1f}x | {off['mean_first'] / on['mean_first']:.1f}x"
                         f" | {off['held'] / on['held']:.1f}x | |")
    return "\n".join(lines)


# ---------------------------------------------------------------------- the harness runs
FIGURES = {"prefix": [("time to first token, ms", "ttft_ms", "{:,.1f}", True, "5x lower"),
                      ("output tok/s", "output_tok_per_s", "{:,.0f}", False, "2x"),
                      ("ms per decode step", "ms_per_decode_step", "{:.2f}", True, "-")],
           "chat": [("total time, s", "total_s", "{:.2f}", True, "-"),
                    *((f"time to first token of turn {k}, ms", f"ttft_ms_turn{k}", "{:,.1f}", True, "-")
                      for k in range(1, 5))],
           "ragged": [("output tok/s", "output_tok_per_s", "{:,.0f}", False, "within 2%")]}


def _newest(workload: str) -> dict | None:
    """The newest committed run of a workload holding this stage and the previous one, at their own KV cache."""
    runs = [results.load(p) for p in RESULTS.glob(f"*_{workload}-*.json")]
    runs = [r for r in runs if {STAGE, PREVIOUS} <= set(r.get("stages", {})) and not r.get("kv_cache_gib")]
    return max(runs, key=lambda r: (r["date"], r.get("time", "")), default=None)


def measured() -> str:
    """`prefix`, `chat` and `ragged`, this stage against the previous one, each figure beside its goal."""
    rows, missing = [], []
    for w, figures in FIGURES.items():
        r = _newest(w)
        if r is None:
            missing.append(w)
            continue
        prev, this = r["stages"][PREVIOUS], r["stages"][STAGE]
        when = f"{r['date']} {r.get('time', '')[:5]}".strip()
        for label, key, fmt, lower, goal in figures:
            if key in prev and key in this:
                ratio = prev[key] / this[key] if lower else this[key] / prev[key]
                said = (f"{ratio:.2f}x" if not lower else f"{ratio:.2f}x lower" if ratio >= 1
                        else f"{1 / ratio:.2f}x higher")
                rows.append(f"| `{w}` ({when}, {r['environment']['gpu']}) | {label} | {fmt.format(prev[key])} | "
                            f"{fmt.format(this[key])} | {said} | {goal} |")
    table = [f"| workload | figure | `{PREVIOUS}` | `{STAGE}` | ratio | goal |", "|" + " --- |" * 6, *rows]
    todo = [f"* `{w}`: not measured yet; `python -m common.bench --stages {PREV_NN},{NN} --workload {w}` measures it."
            for w in missing]
    return "\n\n".join("\n".join(part) for part in (table if rows else [], todo) if part)


GENERATORS = {"hash-chain": hash_chain, "worked-example": worked_example, "eviction": eviction,
              "prefix-plan": prefix_plan, "measured": measured}
