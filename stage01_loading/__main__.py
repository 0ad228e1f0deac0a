"""python -m <this stage> [--model DIR|PRESET] [--prompt TEXT [--chat]]: load a checkpoint onto the GPU, print its
model card, and (with --prompt) the prompt's token ids and their embedding rows, gathered on the GPU. Without a
GPU the checkpoint is validated and the prompt tokenised on the CPU."""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from common.checkpoint import Checkpoint, CheckpointError
from common.cli import FlagError, add_model_flags, announce_preset, default_model, no_gpu_line, utf8_text
from common.config import ConfigError
from common.device import has_gpu
from common.synthetic import resolve_model
from common.tokenizer import Tokenizer, TokenizerError


def parameter_groups(ckpt: Checkpoint) -> dict[str, int]:
    groups: dict[str, int] = {}
    for name, e in ckpt.entries.items():
        kind = ("embedding" if "embed_tokens" in name else "lm_head" if name == "lm_head.weight"
                else "attention" if "self_attn" in name else "mlp" if ".mlp." in name else "norms")
        groups[kind] = groups.get(kind, 0) + e.nbytes // 2
    return groups


def model_card(ckpt: Checkpoint) -> list[str]:
    cfg = ckpt.config
    lines = [f"model      {ckpt.folder}",
             f"shape      {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {cfg.num_attention_heads} heads "
             f"/ {cfg.num_key_value_heads} KV heads of {cfg.head_dim}, MLP {cfg.intermediate_size}, "
             f"vocab {cfg.vocab_size}, {'tied' if cfg.tie_word_embeddings else 'untied'} head",
             f"files      {', '.join(f.name for f in ckpt.files)}"]
    groups = parameter_groups(ckpt)
    total = sum(groups.values())
    for kind, n in groups.items():
        lines.append(f"  {kind:<10} {n:>15,} parameters  {100 * n / total:5.1f}%")
    lines.append(f"  {'total':<10} {total:>15,} parameters  {ckpt.total_bytes / 1e9:.3f} GB in bf16")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__)
    add_model_flags(ap)
    ap.add_argument("--prompt", help="tokenize this and gather its embedding rows (the stage's one kernel)")
    ap.add_argument("--chat", action="store_true", help="wrap --prompt in the Llama 3.2 Instruct chat template")
    args = ap.parse_args(argv)
    ok, _ = has_gpu()
    model = default_model(args.model, ok)     # as every stage's: tiny without a GPU, not 2.47 GB to validate
    announce_preset(model)
    try:
        prompt = utf8_text("--prompt", args.prompt) if args.prompt is not None else None
        ckpt = Checkpoint(resolve_model(model))
        ids = prompt_ids(ckpt.folder, prompt, args.chat) if prompt is not None else None
    except (CheckpointError, ConfigError, FlagError, TokenizerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(model_card(ckpt)))
    if not ok:
        print(no_gpu_line("checkpoint validated on the CPU; nothing was loaded onto a device", args.verbose))
        if ids is not None:
            print(f"prompt     {len(ids)} tokens: {ids[:16]}{' ...' if len(ids) > 16 else ''} (tokenised on the CPU)")
        return 0
    from .engine import Engine

    engine = Engine(model, progress=True)
    s = engine.weights.stats
    print(f"gpu        {engine.gpu.name} ({engine.gpu.arch})")
    print(f"loaded     {s.bytes / 1e9:.3f} GB in {s.seconds:.2f} s = {s.gb_per_s:.2f} GB/s "
          f"(file read + pinned staging + host-to-device copy)")
    print(f"gpu memory {s.gpu_bytes_used / 2**30:.2f} GiB used by the weights")
    t = time.perf_counter()
    bad = engine.verify()
    took = time.perf_counter() - t
    if bad:
        print(f"check      FAILED: {len(bad)} tensors differ from the file, first {bad[0]!r}")
        return 1
    print(f"check      all {len(engine.weights.tensors)} tensors on the GPU equal the file bytes "
          f"(64-bit positional checksums, {took:.1f} s)")
    if ids is not None:
        show_embedding(engine, ids)
    return 0


def prompt_ids(folder, prompt: str, chat: bool) -> list[int]:
    tok = Tokenizer(folder)
    return tok.encode_chat(prompt) if chat else tok.encode(prompt)


def show_embedding(engine, ids: list[int]) -> None:
    """The first step of every forward pass, on the GPU: token ids -> hidden rows (T, H)."""
    from common.bf16 import bf16_to_f32

    rows = bf16_to_f32(engine.embed(ids))                                   # (T, H)
    same = (engine.embed(ids) == engine.checkpoint.raw("model.embed_tokens.weight")[ids]).all()
    print(f"prompt     {len(ids)} tokens: {ids[:16]}{' ...' if len(ids) > 16 else ''}")
    print(f"embedding  ({rows.shape[0]}, {rows.shape[1]}) bf16 gathered on the GPU; row 0 starts "
          f"{np.array2string(rows[0, :4], precision=4)}; rows equal the file's: {bool(same)}")


if __name__ == "__main__":
    sys.exit(main())
