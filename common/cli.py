"""The command line of every generating stage: `python -m <stage> [--model DIR|PRESET] --prompt TEXT [--chat]
[--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--seed S] [--max-model-len L] [--verbose]`.

Text is streamed as it is generated; on a terminal, control characters other than newline and tab are shown
escaped (random weights generate any byte, and a raw ESC would drive the terminal). Without --model: the embedded
1B-shape synthetic checkpoint on a GPU, the tiny preset without one (default_model, for every stage's CLI). Without
a GPU the same request runs through the numpy reference engine, on the model given: a given model is validated
exactly as on a GPU and never swapped for another.
"""
from __future__ import annotations

import argparse
import sys
import time
import unicodedata
from typing import Callable

from common.checkpoint import Checkpoint, CheckpointError
from common.config import ConfigError
from common.device import GpuMemoryError, probe_gpu
from common.prompts import PromptError
from common.sampling import SamplingParams, SamplingParamsError
from common.synthetic import DEFAULT_PRESET, PRESETS, resolve_model
from common.tokenizer import TokenizerError

NO_GPU_PRESET = "tiny"
LARGE_FOR_NUMPY = 100_000_000   # parameters: above this the numpy reference takes seconds per token
FLAGS = {"max_tokens": "--max-tokens", "temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k",
         "seed": "--seed"}     # SamplingParams field -> the flag a user typed


class FlagError(ValueError):
    """A flag's value the command cannot use; the message names the flag."""


UNPRINTABLE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}   # Unicode categories a terminal may act on or mangle
USER_ERRORS = (CheckpointError, ConfigError, FlagError, PromptError, SamplingParamsError, TokenizerError,
               GpuMemoryError)


def no_gpu_line(what: str, verbose: bool) -> str:
    """One line, in the project's words, saying there is no GPU and what runs instead (the library's own
    message only with --verbose)."""
    _, why, detail = probe_gpu()
    return f"no GPU ({why}): {what}" + (f"\n  detail: {detail}" if verbose else "")


def default_model(model: str | None, on_gpu: bool) -> str:
    """--model as given; without it the 1B-shape preset on a GPU and the tiny one without (what --help says)."""
    return model or (DEFAULT_PRESET if on_gpu else NO_GPU_PRESET)


def add_model_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=None, help=f"checkpoint folder or preset ({', '.join(PRESETS)}); default: "
                    f"{DEFAULT_PRESET} on a GPU, {NO_GPU_PRESET} without one (synthetic, random weights)")
    ap.add_argument("--verbose", action="store_true", help="say more about what was found (the GPU probe)")


def utf8_text(flag: str, value: str) -> str:
    """`value` as given, or a FlagError naming the flag when it is not valid UTF-8: Python hands argv bytes it
    cannot decode over as lone surrogates (U+DC80..U+DCFF), which the tokenizer refuses with a TypeError."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(value[e.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"lone surrogate U+{code:04X}"
        raise FlagError(f"{flag}: not valid UTF-8 text ({what} at character {e.start})") from None
    return value


def for_terminal(text: str) -> str:
    """`text` with control, format and separator characters other than newline and tab escaped (ESC -> \\x1b,
    CR -> \\r, U+202E -> \\u202e): what a terminal shows as text instead of obeying."""
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) not in UNPRINTABLE
                   else ch.encode("unicode_escape").decode("ascii") for ch in text)



def announce_preset(model: str) -> None:
    if model in PRESETS:
        shape = "the Llama 3.2 1B shape: real speed" if model == DEFAULT_PRESET else "a smaller shape than 1B"
        print(f"[{model}] synthetic checkpoint: random weights (meaningless text; {shape})")


def sampling_params(args) -> SamplingParams:
    """The request's SamplingParams; an invalid value is reported under the flag that set it."""
    try:
        return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                              top_k=args.top_k, seed=args.seed)
    except SamplingParamsError as e:
        raise SamplingParamsError(f"{FLAGS.get(e.name, e.name)} {e.value!r}: {e.why}", e.name, e.value,
                                  e.why) from None


def generate_main(prog: str, gpu_engine: Callable[[str, int | None], object], argv=None,
                  cpu_engine: Callable[[str, int | None], object] | None = None,
                  engine_flags: Callable[[argparse.ArgumentParser], list[str]] | None = None) -> int:
    """The generating CLI of a stage whose GPU engine `gpu_engine(model, max_model_len)` builds. Without a GPU:
    `cpu_engine(model, max_model_len)`, the stage's own loop over the numpy forward (stage05 on), or else the
    plain numpy reference engine. `engine_flags(parser)` adds a stage's own engine flags and returns their names,
    which go to either engine as keyword arguments."""
    ap = argparse.ArgumentParser(prog=f"python -m {prog}", description=__doc__.split("\n\n")[0])
    add_model_flags(ap)
    ap.add_argument("--prompt", required=True, help="the text to continue (or, with --chat, the user's message)")
    ap.add_argument("--chat", action="store_true", help="wrap the prompt in the Llama 3.2 Instruct chat template")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most (default %(default)s)")
    ap.add_argument("--temperature", type=float, default=SamplingParams.temperature,
                    help="0 is greedy (default %(default)s)")
    ap.add_argument("--top-p", type=float, default=SamplingParams.top_p,
                    help="sample from the smallest set of tokens this likely (default %(default)s: all)")
    ap.add_argument("--top-k", type=int, default=SamplingParams.top_k,
                    help="sample from the k likeliest tokens (default %(default)s: all)")
    ap.add_argument("--seed", type=int, default=None, help="the sampler's seed (default: a random one)")
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="prompt and output tokens at most (default: the model's, at most 4096)")
    options = engine_flags(ap) if engine_flags else []
    args = ap.parse_args(argv)
    options = {name: getattr(args, name) for name in options}
    on_gpu = probe_gpu()[0]
    model = default_model(args.model, on_gpu)
    show = for_terminal if sys.stdout.isatty() else str      # a pipe or file gets the text as generated
    try:
        utf8_text("--prompt", args.prompt)
        params = sampling_params(args)
        if not on_gpu:
            Checkpoint(resolve_model(model))      # a bad --model is refused before anything claims to run on it
            what = "this stage's loop over the numpy forward" if cpu_engine else "the numpy reference engine"
            print(no_gpu_line(f"running {what} on {model} instead", args.verbose))
        announce_preset(model)
        if on_gpu:
            engine = gpu_engine(model, args.max_model_len, **options)
        else:
            engine = numpy_engine(model, args.max_model_len, cpu_engine, **options)
        tok = engine.prompts.tokenizer
        prompt = tok.encode_chat(args.prompt) if args.chat else args.prompt
        text = tok.stream()
        start, n, reason = time.perf_counter(), 0, None
        for token, reason in engine.stream(prompt, params):
            print(show(text.step(token)), end="", flush=True)
            n += 1
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    took = time.perf_counter() - start
    rate = f"{n / took:.1f}" if n >= took else f"{n / took:.3f}"      # a 1B on a CPU makes under one a second
    print(f"\n[{n} tokens in {took:.2f} s, {rate} tok/s, finish_reason={reason!r}, "
          f"time to first token {engine.timings[-1].ttft_s * 1e3:.1f} ms]")
    return 0


def numpy_engine(model: str, max_model_len: int | None, cpu_engine=None, **options):
    """The engine without a GPU, on the given model validated first (a large model is announced as slow): the
    stage's `cpu_engine` (with the stage's own engine `options`), or the plain numpy reference where the stage has
    none."""
    from common.reference import ReferenceEngine

    config = Checkpoint(resolve_model(model)).config      # every validation error, before any weight is read
    n = config.num_parameters()
    if n > LARGE_FOR_NUMPY:
        print(f"note: {n / 1e9:.2f}B parameters in float32 on the CPU ({4 * n / 1e9:.1f} GB of memory); "
              "expect seconds per token")
    return (cpu_engine or ReferenceEngine)(model, max_model_len=max_model_len, **options)
