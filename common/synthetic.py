"""Synthetic checkpoints in exactly the Hugging Face layout of Llama 3.2 1B Instruct, with random weights.

    python -m common.synthetic --preset tiny|small|llama-3.2-1b --out DIR [--seed S] [--shards N] [--untied]
                               [--tokenizer PATH]

Writes config.json, generation_config.json, model.safetensors (or N shards plus model.safetensors.index.json)
and tokenizer.json. Real weights cannot be downloaded on our machines; these have the real shapes, names and
dtypes, so loading, speed and memory are real, and the text is meaningless.

The init, and why its logits are peaked but not degenerate:
  * every matrix is N(0, 1/fan_in), so each projection of a normalised activation has entries of rms ~1;
    the residual stream is therefore dominated by the layers, not the token's own embedding;
  * embedding rows are N(0, 1/H) directions scaled by a log-normal row norm exp(0.4 z): the tied LM head gives
    logit_v = |E_v| * (g . h) . e_v, a heavier tail than a Gaussian, so the top token stands clear of the next;
  * the final norm weight g has random signs and magnitude LOGIT_SCALE: the signs stop a token's own
    embedding (still in the residual) from always winning, which would make greedy text repeat one token.
tests/test_synthetic.py measures the top-1 margin and the variety of greedy output on the tiny preset.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from common.bf16 import f32_to_bf16
from common.checkpoint import INDEX_FILE, SINGLE_FILE, CheckpointError
from common.config import LlamaConfig, RopeScaling

LLAMA3_EOS = (128001, 128008, 128009)
LLAMA3_ROPE = RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192)
LOGIT_SCALE = 4.0
ROW_NORM_SIGMA = 0.4


LLAMA31_ROPE = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=8192)


def _preset(**shape) -> LlamaConfig:
    shape = {"rope_scaling": LLAMA3_ROPE, "tie_word_embeddings": True, **shape}
    return LlamaConfig(vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
                       bos_token_id=128000, eos_token_ids=LLAMA3_EOS, source="preset", **shape)


PRESETS = {
    # the vocabulary is the real one everywhere, so Llama 3 special tokens keep their real ids
    "tiny": _preset(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16),
    "small": _preset(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
                     num_key_value_heads=2, head_dim=32),
    "llama-3.2-1b": _preset(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=64),
    # the shape tensor parallelism pays on (16 GB in bf16: written once, like the 1B, when first asked for)
    "llama-3.1-8b": _preset(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_scaling=LLAMA31_ROPE,
                            tie_word_embeddings=False),
}
DEFAULT_PRESET = "llama-3.2-1b"


# ---------------------------------------------------------------------------- weights
def init_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """float32 values for one tensor under the scheme in the module docstring."""
    if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
        dirs = rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[1]))
        norms = np.exp(ROW_NORM_SIGMA * rng.standard_normal((shape[0], 1), dtype=np.float32))
        return dirs * norms
    if name == "model.norm.weight":
        return LOGIT_SCALE * np.where(rng.random(shape) < 0.5, -1.0, 1.0).astype(np.float32)
    if name.endswith("layernorm.weight"):
        return rng.uniform(0.8, 1.2, shape).astype(np.float32)
    return rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[1]))


def _readable_as_umask_allows(path: Path) -> None:
    """safetensors writes its file owner-only (0600); a shared $TINY_VLLM_CACHE needs the mode every other file of
    the folder gets, 0666 less the umask."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def write_checkpoint(cfg: LlamaConfig, out: str | Path, seed: int = 0, shards: int = 1,
                     tokenizer: str | Path | None = None) -> Path:
    """Write a full checkpoint folder; returns it. Written into a temporary folder and renamed at the end,
    so an interrupted run leaves nothing that looks complete."""
    from safetensors import TensorSpec, serialize_file

    out = Path(out)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    shapes = cfg.tensor_shapes()
    names = list(shapes)
    groups = _split_evenly(names, shapes, shards)
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        file = SINGLE_FILE if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        data = {n: f32_to_bf16(init_tensor(n, shapes[n], rng)) for n in group}
        specs = {n: TensorSpec(dtype="bfloat16", shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
                 for n, a in data.items()}
        serialize_file(specs, str(tmp / file), metadata={"format": "pt"})
        _readable_as_umask_allows(tmp / file)
        for n, a in data.items():
            weight_map[n] = file
            total += a.nbytes
        del data, specs
    if shards > 1:
        (tmp / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                 indent=2))
    (tmp / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2))
    (tmp / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": cfg.bos_token_id, "eos_token_id": list(cfg.eos_token_ids), "do_sample": True,
         "temperature": 0.6, "top_p": 0.9}, indent=2))
    if tokenizer is not None:
        src = Path(tokenizer)
        shutil.copy(src / "tokenizer.json" if src.is_dir() else src, tmp / "tokenizer.json")
    else:
        build_tokenizer().save(str(tmp / "tokenizer.json"))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _split_evenly(names, shapes, shards):
    """Consecutive groups of tensors with about equal bytes (how HF shards: in order, by size)."""
    if shards < 1:
        raise ValueError(f"--shards must be >= 1, got {shards}")
    if shards > len(names):
        raise ValueError(f"{shards} shards is more than this model's {len(names)} tensors can fill")
    sizes = [int(np.prod(shapes[n])) for n in names]
    target, groups, acc, cur = sum(sizes) / shards, [[] for _ in range(shards)], 0, 0
    for j, (n, s) in enumerate(zip(names, sizes)):
        want = min(int(acc / target), shards - 1)
        # advance at most one shard per tensor, and leave at least one tensor for every later shard
        cur = max(cur, min(want, cur + 1), shards - (len(names) - j))
        groups[cur].append(n)
        acc += s
    return groups


# ---------------------------------------------------------------------------- tokenizer
SPECIAL_NAMES = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 4: "<|finetune_right_pad_id|>",
                 6: "<|start_header_id|>", 7: "<|end_header_id|>", 8: "<|eom_id|>", 9: "<|eot_id|>",
                 10: "<|python_tag|>"}
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = """The quick brown fox jumps over the lazy dog. A language model predicts the next token from the ones
before it. Inference engines batch requests, cache keys and values, and page the cache into blocks so that
memory is not wasted. Hello, world! How are you today? I am fine, thank you. Numbers: 0 1 2 3 4 5 6 7 8 9 10
100 2024. The GPU reads the weights once per step; the bandwidth of its memory sets the speed of decoding."""


def llama3_special_tokens() -> list[str]:
    """The 256 special tokens at ids 128000..128255, named as in Llama 3.2."""
    names, reserved = [], 0
    for i in range(256):
        if i in SPECIAL_NAMES:
            names.append(SPECIAL_NAMES[i])
        else:
            names.append(f"<|reserved_special_token_{reserved}|>")
            reserved += 1
    return names


def build_tokenizer(n_regular: int = 128000):
    """A byte-level BPE with Llama 3's pre-tokeniser, trained on a short corpus, padded with byte-pair tokens
    to n_regular ids, then the special tokens at their real ids. Decodes any id to some bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers, Regex

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([CORPUS] * 4, trainers.BpeTrainer(
        vocab_size=1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = json.loads(tok.to_str())["model"]
    vocab, merges = model["vocab"], model["merges"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    fillers = (a + b for a in alphabet for b in alphabet)  # two-byte tokens: 65536, then three-byte ones
    fillers3 = (a + b + c for a in alphabet for b in alphabet for c in alphabet)
    for piece in itertools.chain(fillers, fillers3):
        if len(vocab) >= n_regular:
            break
        vocab.setdefault(piece, len(vocab))
    tok.model = models.BPE(vocab=vocab, merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" "))
                                                for m in merges])
    tok.add_special_tokens(llama3_special_tokens())
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", n_regular)])
    return tok


# ---------------------------------------------------------------------------- presets on disk
def resolve_model(model: str | Path) -> Path:
    """A checkpoint folder as given, or a preset name -> its folder in the cache (written on first use). A bare
    name that is neither (a mistyped preset, say) is refused naming the presets."""
    if str(model) in PRESETS:
        return ensure_preset(str(model))
    if not Path(model).exists() and len(Path(model).parts) == 1:
        raise CheckpointError(f"{model}: no such checkpoint folder, nor a preset ({', '.join(PRESETS)})")
    return Path(model)


def ensure_preset(name: str, seed: int = 0) -> Path:
    from common.compile import cache_root

    folder = cache_root() / "checkpoints" / f"{name}-seed{seed}"
    if not (folder / "config.json").exists():
        big = PRESETS[name].num_parameters() > 100_000_000
        if big:
            print(f"[tiny-vllm] writing the {name} synthetic checkpoint (random weights, "
                  f"{PRESETS[name].num_parameters() * 2 / 1e9:.2f} GB) to {folder} once ...", file=sys.stderr)
        write_checkpoint(PRESETS[name], folder, seed=seed)
    return folder


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.synthetic", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--untied", action="store_true", help="write a separate lm_head.weight")
    ap.add_argument("--tokenizer", type=Path, help="copy this tokenizer.json instead of building one")
    a = ap.parse_args(argv)
    cfg = PRESETS[a.preset]
    if a.untied:
        from dataclasses import replace
        cfg = replace(cfg, tie_word_embeddings=False)
    out = write_checkpoint(cfg, a.out, seed=a.seed, shards=a.shards, tokenizer=a.tokenizer)
    print(f"wrote {out}: {a.preset}, {cfg.num_parameters():,} parameters, "
          f"{'untied' if a.untied else 'tied'}, {a.shards} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
