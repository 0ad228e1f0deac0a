"""The benchmark workloads of the design: seeded request sets, each with its headline figures and direction.

    latency  1 request, 128 + 256 tokens        ms per decode step (lower is better), TTFT, bandwidth use
    growth   1 request, 512 + 1024 tokens       decode tok/s over the first 64, 256, 1024 new tokens
    batch    B = 1 .. 256 of 128 + 128          output tok/s at each B
    ragged   256 requests, 100..1024 each way   output tok/s (nano-vllm's bench.py workload)
    prefix   256 requests, one 2048-token system prompt + 32..512 of their own, 64..256 new: TTFT, output tok/s
    chat     64 conversations of 4 turns, each turn every earlier one and its answer + 32..256 new tokens of
             message, sent when the answer before it finished; 64..256 new: total time, TTFT by turn
    long     1 request of 2048, 8192, 32768     prefill tok/s, memory beyond the weights
    cpu      64 requests, 16..256 + 2..64       output tok/s of the tiny preset on a CPU (the numpy engines)
    load     stage01's: weights onto the GPU    GB/s against a plain read of the same bytes
Every request is greedy with ignore_eos, so every run generates the same number of tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.sampling import SamplingParams

GROWTH_LENGTHS = (64, 256, 1024)
BATCH_SIZES = (1, 8, 32, 64, 128, 256)   # `batch`: the first B of its 256 requests, given to generate() together;
#                                         128 and 256 are where the host's share of a step shows
LONG_LENGTHS = (2048, 8192, 32768)
CHAT_TURNS = 4  # `long`: one prompt of each length, each in its own process


@dataclass(frozen=True)
class Workload:
    name: str
    requests: int
    prompt_tokens: tuple[int, int]   # (low, high), uniform; equal for a fixed length
    new_tokens: tuple[int, int]
    figure: str
    headline: tuple[str, ...]        # the figures the ratio columns compare
    lower_is_better: bool = False
    columns: tuple[str, ...] = ()    # further figures the table shows
    shared_prefix: int = 0           # tokens every prompt starts with (a system prompt), before its own
    turns: int = 1                   # a conversation's turns (chat): each prompt holds every turn before it

    @property
    def max_model_len(self) -> int:
        return self.shared_prefix + self.turns * (self.prompt_tokens[1] + self.new_tokens[1])


WORKLOADS = {w.name: w for w in [
    Workload("load", 0, (0, 0), (0, 0), "weights onto the GPU, GB/s, against a plain read of the same file bytes",
             ("load_gb_per_s",), columns=("plain_read_gb_per_s",)),
    Workload("latency", 1, (128, 128), (256, 256), "ms per decode step, time to first token, bandwidth use",
             ("ms_per_decode_step",), lower_is_better=True,
             columns=("ttft_ms", "output_tok_per_s", "bandwidth_utilisation")),
    Workload("growth", 1, (512, 512), (1024, 1024), "decode tok/s over the first 64, 256, 1024 new tokens",
             tuple(f"decode_tok_per_s_at_{n}" for n in GROWTH_LENGTHS)),
    Workload("batch", BATCH_SIZES[-1], (128, 128), (128, 128), "output tok/s at B = "
             + ", ".join(map(str, BATCH_SIZES)),
             tuple(f"output_tok_per_s_at_B{n}" for n in BATCH_SIZES)),
    Workload("ragged", 256, (100, 1024), (100, 1024), "output tok/s (nano-vllm's bench.py workload)",
             ("output_tok_per_s",),
             columns=("ttft_ms", "queue_ms", "ms_per_decode_step", "itl_p99_ms", "mean_running", "max_running",
                      "preemptions", "slot_waste", "padding_share", "prefill_time_share", "host_time_share")),
    Workload("prefix", 256, (32, 512), (64, 256), "time to first token and output tok/s, every prompt a shared "
             "2048-token system prompt and 32..512 tokens of its own", ("ttft_ms", "output_tok_per_s"),
             columns=("ms_per_decode_step", "queue_ms", "max_running", "preemptions", "host_time_share"),
             shared_prefix=2048),
    Workload("chat", 64, (32, 256), (64, 256), "total time and time to first token by turn: 64 conversations of "
             f"{CHAT_TURNS} turns, each turn every earlier message and answer plus a new message, sent when the "
             "answer before it finished", ("total_s",), lower_is_better=True,
             columns=("output_tok_per_s", *(f"ttft_ms_turn{k}" for k in range(1, CHAT_TURNS + 1))), turns=CHAT_TURNS),
    Workload("long", 1, (LONG_LENGTHS[-1], LONG_LENGTHS[-1]), (64, 64),
             "prefill tok/s (prompt tokens / time to first token) at 2048, 8192, 32768; memory beyond the weights",
             tuple(f"prefill_tok_per_s_at_{n}" for n in LONG_LENGTHS),
             columns=tuple(f"memory_beyond_weights_gb_at_{n}" for n in LONG_LENGTHS)),
    Workload("cpu", 64, (16, 256), (2, 64), "output tok/s on a CPU: the tiny preset through the numpy engines, "
             "64 requests at once (a server's smoke load where there is no GPU)", ("output_tok_per_s",),
             columns=("ttft_ms",)),
]}


@dataclass(frozen=True)
class Ladder:
    """The engines of a workload's ladder run (`python -m common.bench --ladder --workload W`): every stage from
    `first_stage` on, then `baselines`, in one run on one machine, each in its own process. `left_out` says which
    engines a user might look for are not in it, and why: a ladder run must fit one 10-minute GPU command (the
    times quoted are the H200 runs of 2026-12-03 and 04)."""

    first_stage: int
    baselines: tuple[str, ...]
    left_out: str
    # a second ladder run at one KV cache memory for every engine, (GiB, max_model_len, first stage): where a
    # stage's idea shows only when memory is short (paging: contiguous regions of max_model_len hold few sequences)
    budget: tuple[float, int, int] | None = None


LADDERS = {
    "load": Ladder(1, (), "none"),
    "latency": Ladder(2, ("hf", "hf-compile"), "stage01 (it generates nothing); hf-sdpa and hf-cb (at batch 1 "
                      "they are hf with another attention, and hf-compile is what a user would pick there)"),
    "batch": Ladder(4, ("hf-sdpa",), "stages 02 and 03 (one sequence at a time: the 489 requests of a repeat, "
                    "B = 1 .. 256, would take stage03 over 3 minutes, stage02 far longer); hf and hf-compile (one "
                    "request at a time too); hf-cb (on ragged it made 862 tok/s, 2026-12-05: run it alone, "
                    "--stages hf-cb --repeats 1)"),
    "ragged": Ladder(4, (), "stages 02 and 03 (one sequence at a time); hf-sdpa (256 requests left-padded into "
                     "one batch: about 80 s a repeat at 1,832 tok/s) and hf-cb (862 tok/s, 2026-12-05: about 170 s "
                     "a repeat), which would not fit the command: run them alone, --stages hf-cb --repeats 1; hf "
                     "and hf-compile (one request at a time). At the budget (4 GiB of KV cache, max_model_len "
                     "4096, stage07's chapter): stages 04 and 05 too (32 contiguous regions: minutes a repeat)",
                     budget=(4.0, 4096, 6)),
    "long": Ladder(6, ("hf-sdpa",), "stages 02 to 05 (their attention materialises the scores: about a minute "
                   "a 32K prefill, 4 of them an engine; stage06's chapter compares them at every length); hf and "
                   "hf-compile (hf-sdpa is the transformers attention a user would pick for long prompts)"),
}


def make_conversations(name: str = "chat", vocab_size: int = 128000, seed: int = 0
                       ) -> list[list[tuple[list[int], SamplingParams]]]:
    """A multi-turn workload's conversations: each a list of turns, (the new message's token ids, params); a turn's
    prompt is every earlier message and answer followed by its message (common/bench/measure.chat_once)."""
    w = WORKLOADS[name]
    rng = np.random.default_rng(seed)
    return [[(rng.integers(0, vocab_size, int(rng.integers(w.prompt_tokens[0], w.prompt_tokens[1] + 1))).tolist(),
              SamplingParams(max_tokens=int(rng.integers(w.new_tokens[0], w.new_tokens[1] + 1)), temperature=0.0,
                             ignore_eos=True))
             for _ in range(w.turns)] for _ in range(w.requests)]


def make_requests(name: str, vocab_size: int = 128000, seed: int = 0, prompt_tokens: int | None = None
                  ) -> list[tuple[list[int], SamplingParams]]:
    """The workload's requests: random regular-token prompts (no special ids) and greedy ignore_eos params.
    `prompt_tokens` fixes the prompt length (`long` runs one per length); a workload with a shared prefix starts
    every prompt with the same shared_prefix tokens."""
    w = WORKLOADS[name]
    low, high = (prompt_tokens, prompt_tokens) if prompt_tokens else w.prompt_tokens
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, vocab_size, w.shared_prefix).tolist()
    out = []
    for _ in range(w.requests):
        p = int(rng.integers(low, high + 1))
        n = int(rng.integers(w.new_tokens[0], w.new_tokens[1] + 1))
        out.append((shared + rng.integers(0, vocab_size, p).tolist(),
                    SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)))
    return out
