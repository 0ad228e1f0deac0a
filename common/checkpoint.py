"""A Hugging Face checkpoint folder, opened and validated: which tensor lives where, and its bytes.

The safetensors format is an 8-byte little-endian header length N, then N bytes of JSON
    {"model.norm.weight": {"dtype": "BF16", "shape": [2048], "data_offsets": [begin, end]}, ..., "__metadata__": {...}}
then the raw tensor bytes, offsets counted from the end of the header. So a tensor is a slice of the file:
we map the file (mmap) and view the slice, reading nothing until the bytes are used.

safetensors itself (safe_open) checks each file first: a truncated or corrupt file is refused there.
Every stage and the numpy reference read checkpoints through this one class.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.bf16 import bf16_to_f32
from common.config import LlamaConfig

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
WEIGHT_DTYPE = "BF16"


class CheckpointError(ValueError):
    """The checkpoint folder is unusable; the message names the file and tensor."""


def tolerated_extra(name: str, config: LlamaConfig) -> bool:
    """Tensors some checkpoints carry that the model does not use (vLLM skips the same ones)."""
    return name.endswith("rotary_emb.inv_freq") or (config.tie_word_embeddings and name == "lm_head.weight")


@dataclass(frozen=True)
class TensorEntry:
    name: str
    file: Path
    dtype: str             # safetensors dtype string, "BF16" for every tensor we accept
    shape: tuple[int, ...]
    offset: int            # absolute byte offset of the first byte in `file`
    nbytes: int


class Checkpoint:
    """config + every expected tensor's location, validated against the config."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not self.folder.exists():
            raise CheckpointError(f"{self.folder}: no such checkpoint folder")
        if not self.folder.is_dir():
            raise CheckpointError(f"{self.folder}: is not a folder (give the checkpoint folder, "
                                  "the one holding config.json and model.safetensors)")
        self.config = LlamaConfig.from_file(self.folder / "config.json")
        self.files = self._find_files()
        found: dict[str, TensorEntry] = {}
        for file in self.files:
            for entry in _read_header(file):
                if entry.name in found:
                    raise CheckpointError(f"{file}: tensor {entry.name!r} also in {found[entry.name].file.name}")
                found[entry.name] = entry
        self._check_index(found)
        self.entries = self._validate(found)
        self._maps: dict[Path, np.memmap] = {}

    # ------------------------------------------------------------------ files
    def _find_files(self) -> list[Path]:
        index = self.folder / INDEX_FILE
        if index.exists():
            try:
                self.weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index}: not a safetensors index ({type(e).__name__}: {e})") from None
            files = [self.folder / f for f in sorted(set(self.weight_map.values()))]
            for f in files:
                if not f.exists():
                    raise CheckpointError(f"{index}: names shard {f.name}, which is missing from {self.folder}")
            return files
        self.weight_map = None
        single = self.folder / SINGLE_FILE
        if not single.exists():
            raise CheckpointError(f"{self.folder}: neither {SINGLE_FILE} nor {INDEX_FILE} found")
        return [single]

    def _check_index(self, found: dict[str, TensorEntry]) -> None:
        if self.weight_map is None:
            return
        for name, file in self.weight_map.items():
            if name not in found:
                raise CheckpointError(f"{self.folder / INDEX_FILE}: lists tensor {name!r} in {file}, "
                                      "but no shard holds it")
            if found[name].file.name != file:
                raise CheckpointError(f"{self.folder / INDEX_FILE}: lists tensor {name!r} in {file}, "
                                      f"but it is in {found[name].file.name}")
        for name, entry in found.items():
            if name not in self.weight_map:
                raise CheckpointError(f"{entry.file}: tensor {name!r} is not listed in {INDEX_FILE}")

    def _validate(self, found: dict[str, TensorEntry]) -> dict[str, TensorEntry]:
        expected = self.config.tensor_shapes()
        missing = [n for n in expected if n not in found]
        if missing:
            where = ", ".join(f.name for f in self.files)
            more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
            raise CheckpointError(f"{self.folder}: tensor {missing[0]!r} is missing from {where}; missing: "
                                  f"{', '.join(map(repr, missing[:3]))}{more}")
        for name, entry in found.items():
            if name not in expected and not tolerated_extra(name, self.config):
                raise CheckpointError(f"{entry.file}: unexpected tensor {name!r} {list(entry.shape)} for "
                                      f"a {self.config.num_hidden_layers}-layer Llama (config {self.config.source})")
        entries = {}
        for name, shape in expected.items():
            e = found[name]
            if e.dtype != WEIGHT_DTYPE:
                raise CheckpointError(f"{e.file}: tensor {name!r} has dtype {e.dtype}; this engine loads "
                                      f"{WEIGHT_DTYPE} checkpoints (Llama 3.2 ships in bf16)")
            if e.shape != shape:
                raise CheckpointError(f"{e.file}: tensor {name!r} has shape {list(e.shape)}, "
                                      f"the config implies {list(shape)}")
            entries[name] = e
        return entries

    # ------------------------------------------------------------------ bytes
    def raw(self, name: str) -> np.ndarray:
        """The tensor's bf16 bits as a read-only uint16 view of the mapped file (no copy)."""
        e = self.entries[name]
        mm = self._maps.get(e.file)
        if mm is None:
            mm = self._maps[e.file] = np.memmap(e.file, dtype=np.uint8, mode="r")
        return mm[e.offset:e.offset + e.nbytes].view(np.uint16).reshape(e.shape)

    def f32(self, name: str) -> np.ndarray:
        return bf16_to_f32(self.raw(name))

    @property
    def total_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def file_order(self) -> list[TensorEntry]:
        """Entries sorted by file and offset: the order that reads each file front to back."""
        return sorted(self.entries.values(), key=lambda e: (str(e.file), e.offset))


def _read_header(file: Path) -> list[TensorEntry]:
    from safetensors import SafetensorError, safe_open

    try:  # let safetensors judge the file first: it refuses truncated data and malformed headers
        with safe_open(str(file), framework="numpy"):
            pass
    except SafetensorError as e:
        raise CheckpointError(f"{file}: not a valid safetensors file ({e})") from None
    size = file.stat().st_size
    with open(file, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data_start = 8 + header_len
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if data_start + end > size:
            raise CheckpointError(f"{file}: tensor {name!r} ends at byte {data_start + end}, past the end "
                                  f"of the file ({size} bytes): the file is truncated")
        entries.append(TensorEntry(name, file, info["dtype"], tuple(info["shape"]), data_start + begin, end - begin))
    return entries
