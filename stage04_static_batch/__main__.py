"""python -m stage04_static_batch [--model DIR|PRESET] --prompt TEXT [--chat] [--max-tokens N] [--temperature T]
[--top-p P] [--top-k K] [--seed S]: generate text, streamed token by token, on the GPU (without one, through the
numpy reference engine on the tiny preset)."""
from __future__ import annotations

import argparse
import sys
import time

from common.checkpoint import CheckpointError
from common.config import ConfigError
from common.device import has_gpu
from common.prompts import PromptError
from common.sampling import SamplingParams, SamplingParamsError
from common.synthetic import DEFAULT_PRESET, PRESETS

NO_GPU_PRESET = "tiny"


def parse(argv):
    ap = argparse.ArgumentParser(prog="python -m stage04_static_batch", description=__doc__)
    ap.add_argument("--model", default=DEFAULT_PRESET,
                    help=f"checkpoint folder or preset ({', '.join(PRESETS)}); default: {DEFAULT_PRESET}")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--chat", action="store_true", help="wrap the prompt in the Llama 3.2 Instruct chat template")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=SamplingParams.temperature)
    ap.add_argument("--top-p", type=float, default=SamplingParams.top_p)
    ap.add_argument("--top-k", type=int, default=SamplingParams.top_k)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--max-model-len", type=int, default=None)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    ok, why = has_gpu()
    model = args.model
    if not ok:
        print(f"no GPU ({why}): running the numpy reference engine on the {NO_GPU_PRESET} preset instead")
        model = NO_GPU_PRESET
    if model in PRESETS:
        print(f"[{model}] synthetic checkpoint: random weights (meaningless text, real shapes and speed)")
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed)
        if ok:
            from .engine import Engine

            engine = Engine(model, max_model_len=args.max_model_len, progress=True)
        else:
            from common.reference import ReferenceEngine

            engine = ReferenceEngine(model, max_model_len=args.max_model_len)
        tok = engine.prompts.tokenizer
        prompt = tok.encode_chat(args.prompt) if args.chat else args.prompt
        text = tok.stream()
        start, n, reason = time.perf_counter(), 0, None
        for token, reason in engine.stream(prompt, params):
            print(text.step(token), end="", flush=True)
            n += 1
    except (CheckpointError, ConfigError, PromptError, SamplingParamsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    took = time.perf_counter() - start
    print(f"\n[{n} tokens in {took:.2f} s, {n / took:.1f} tok/s, finish_reason={reason!r}"
          + (f", time to first token {engine.timings[-1].ttft_s * 1e3:.1f} ms" if ok else "") + "]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
