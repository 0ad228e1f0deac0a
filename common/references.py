"""The logits every stage's GPU tests compare with, computed once a process: the numpy float32 reference
(common/reference.py), HF transformers in bf16, and the float32 torch reference of a long prompt's last positions
(common/reference_torch.py).

Each stage's copy of a model test asks the same checkpoint the same question (the 1B shape over 200 positions,
its 8,192- and 32,768-token prompts), and the answer depends only on the checkpoint and the token ids: a run of
every stage's GPU tests in one process pays the 1B's numpy forward and HF's load and forward once, not once a
stage. The key is the folder with every file's size and modification time, so a checkpoint rewritten in place is
asked afresh. The arrays are read-only: a test that wrote into one would change what every later test compares
with, so numpy refuses the write.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np


def _key(folder) -> tuple:
    p = Path(folder).resolve()
    return str(p), tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in p.iterdir() if f.is_file()))


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def reference_logits(folder, ids) -> np.ndarray:
    """(len(ids), V) float32: ReferenceModel(Checkpoint(folder)).forward(ids)."""
    return _reference(_key(folder), tuple(int(i) for i in ids))


def hf_logits(folder, ids, keep: int = 0) -> np.ndarray:
    """(len(ids) or keep, V) float32: HF transformers' logits in bf16 with sdpa attention, on the GPU, of its last
    `keep` positions (0: all). The model is freed, and torch's cached memory given back, before it returns."""
    return _hf(_key(folder), tuple(int(i) for i in ids), keep)


def torch_last_logits(folder, ids, keep: int) -> np.ndarray:
    """(keep, V) float32: reference_torch.last_logits over the checkpoint on the GPU, torch's cache given back."""
    return _torch_last(_key(folder), tuple(int(i) for i in ids), keep)


@functools.cache
def _reference(key: tuple, ids: tuple) -> np.ndarray:
    from common.checkpoint import Checkpoint
    from common.reference import ReferenceModel

    return _frozen(ReferenceModel(Checkpoint(key[0])).forward(list(ids)))


@functools.cache
def _hf(key: tuple, ids: tuple, keep: int) -> np.ndarray:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(key[0], dtype=torch.bfloat16,
                                                              attn_implementation="sdpa").cuda().eval()
    with torch.no_grad():
        logits = model(torch.tensor([list(ids)], device="cuda"), logits_to_keep=keep).logits
    out = logits[0].float().cpu().numpy()
    del model, logits
    torch.cuda.empty_cache()
    return _frozen(out)


@functools.cache
def _torch_last(key: tuple, ids: tuple, keep: int) -> np.ndarray:
    import torch

    from common.checkpoint import Checkpoint
    from common.reference_torch import last_logits

    out = last_logits(Checkpoint(key[0]), np.array(ids, np.int32), keep, device="cuda")
    torch.cuda.empty_cache()
    return _frozen(np.asarray(out))
