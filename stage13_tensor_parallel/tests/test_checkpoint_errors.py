"""Every way a checkpoint folder can be wrong gives an error naming the file and the tensor (CPU only)."""
import json
import shutil
import struct

import numpy as np
import pytest

from common.checkpoint import Checkpoint, CheckpointError
from common.config import ConfigError


def copy(src, tmp_path):
    dst = tmp_path / "m"
    shutil.copytree(src, dst)
    return dst


def rewrite_header(file, edit):
    """Edit the JSON header of a safetensors file in place, keeping its data bytes."""
    raw = file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    file.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def rewrite_tensors(file, edit):
    """Rewrite a safetensors file through safetensors itself, after `edit` changed {name: (dtype, shape, bytes)}."""
    from safetensors import TensorSpec, serialize_file

    raw = file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    tensors = {k: ("bfloat16", v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
               for k, v in header.items()}
    edit(tensors)
    keep = {k: np.frombuffer(b, dtype=np.uint8).copy() for k, (_, _, b) in tensors.items()}
    serialize_file({k: TensorSpec(dtype=d, shape=s, data_ptr=keep[k].ctypes.data, data_len=keep[k].nbytes)
                    for k, (d, s, _) in tensors.items()}, str(file), metadata={"format": "pt"})


def test_valid_folders_open(tiny_dir, tiny_sharded_dir, tiny_untied_dir):
    for folder in (tiny_dir, tiny_sharded_dir, tiny_untied_dir):
        assert len(Checkpoint(folder).entries) == len(Checkpoint(folder).config.tensor_shapes())


def test_not_a_folder(tiny_dir, tmp_path):
    with pytest.raises(CheckpointError, match="is not a folder"):
        Checkpoint(tiny_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        Checkpoint(tmp_path / "absent")


def test_no_weights_file(tiny_dir, tmp_path):
    m = copy(tiny_dir, tmp_path)
    (m / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="neither model.safetensors nor model.safetensors.index.json"):
        Checkpoint(m)


def test_missing_tensor(tiny_dir, tmp_path):
    m = copy(tiny_dir, tmp_path)
    rewrite_tensors(m / "model.safetensors", lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' is missing from model"):
        Checkpoint(m)


def test_unexpected_tensor(tiny_dir, tmp_path):
    m = copy(tiny_dir, tmp_path)
    rewrite_tensors(m / "model.safetensors", lambda t: t.update(
        {"model.layers.7.self_attn.q_proj.weight": t["model.norm.weight"]}))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: unexpected tensor 'model\.layers\.7"):
        Checkpoint(m)


def test_wrong_shape(tiny_dir, tmp_path):
    m = copy(tiny_dir, tmp_path)
    def edit(h):
        h["model.norm.weight"]["shape"] = [32, 2]
    rewrite_header(m / "model.safetensors", edit)
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight' has shape \[32, 2\], the config implies \[64\]"):
        Checkpoint(m)


def test_wrong_dtype(tiny_dir, tmp_path):
    m = copy(tiny_dir, tmp_path)
    def edit(h):
        h["model.norm.weight"]["dtype"] = "F16"
    rewrite_header(m / "model.safetensors", edit)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'model\.norm\.weight' has dtype F16"):
        Checkpoint(m)


def test_truncated_file(tiny_dir, tmp_path):
    m = copy(tiny_dir, tmp_path)
    f = m / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a valid safetensors file"):
        Checkpoint(m)


def test_sharded_index_problems(tiny_sharded_dir, tmp_path):
    m = copy(tiny_sharded_dir, tmp_path)
    (m / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match="names shard model-00002-of-00003.safetensors, which is missing"):
        Checkpoint(m)
    m2 = copy(tiny_sharded_dir, tmp_path / "b")
    index = json.loads((m2 / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00003.safetensors"
    (m2 / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"lists tensor 'model\.norm\.weight' in model-00001"):
        Checkpoint(m2)


def test_bad_config_is_reported_before_any_weights(tiny_dir, tmp_path):
    m = copy(tiny_dir, tmp_path)
    cfg = json.loads((m / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (m / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"config\.json: architecture \['GPT2LMHeadModel'\]"):
        Checkpoint(m)


def test_tied_checkpoint_may_carry_an_unused_lm_head(tiny_dir, tmp_path):
    m = copy(tiny_dir, tmp_path)
    rewrite_tensors(m / "model.safetensors", lambda t: t.update(
        {"lm_head.weight": t["model.embed_tokens.weight"]}))
    assert "lm_head.weight" not in Checkpoint(m).entries  # vLLM skips it too
