"""Test plumbing for every folder: the `gpu` marker skips with the reason where no CUDA device exists, the
`multigpu` marker where there are fewer than two, and session-wide synthetic checkpoints (written once into a temporary folder)."""
from pathlib import Path

import pytest

from common.device import gpu_count, has_gpu

ROOT = Path(__file__).parent
LLAMA3_TOKENIZER = ROOT.parent / "shared" / "llama3-tokenizer"


def pytest_collection_modifyitems(config, items):
    ok, why = has_gpu()
    gpus = gpu_count() if ok else 0
    for item in items:
        if "gpu" in item.keywords and not ok:
            item.add_marker(pytest.mark.skip(reason=f"no GPU: {why}"))
        elif "multigpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason=f"{gpus} GPU on this machine: the test splits a model over 2"))


def _write(tmp_path_factory, name, **kw):
    from dataclasses import replace

    from common.synthetic import PRESETS, write_checkpoint

    preset = kw.pop("preset", "tiny")
    cfg = replace(PRESETS[preset], **kw.pop("config", {}))
    return write_checkpoint(cfg, tmp_path_factory.mktemp("ckpt") / name, **kw)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return _write(tmp_path_factory, "tiny")


@pytest.fixture(scope="session")
def tiny_sharded_dir(tmp_path_factory):
    return _write(tmp_path_factory, "tiny-sharded", shards=3, seed=1)


@pytest.fixture(scope="session")
def tiny_untied_dir(tmp_path_factory):
    return _write(tmp_path_factory, "tiny-untied", config={"tie_word_embeddings": False}, seed=2)


@pytest.fixture(scope="session")
def small_dir(tmp_path_factory):
    return _write(tmp_path_factory, "small", preset="small")


@pytest.fixture(scope="session")
def llama3_tokenizer():
    if not (LLAMA3_TOKENIZER / "tokenizer.json").exists():
        pytest.skip(f"the real Llama 3 tokenizer is not at {LLAMA3_TOKENIZER} (test data, never committed)")
    return LLAMA3_TOKENIZER
