"""This stage's kernels: compiled once (NVRTC, disk-cached), with typed launchers that check their arguments.

Every launcher takes DeviceArrays, checks shapes and dtypes (a wrong call is an error here, not garbage on the
GPU), and launches on the engine's stream. LaunchConfigs are built once per shape and reused.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from common.compile import KernelModule
from common.device import DeviceArray, Gpu

KERNEL_DIR = Path(__file__).parent / "kernels"
KERNEL_FILES = sorted(KERNEL_DIR.glob("*.cu"))
THREADS = 256
SAMPLER_THREADS = 1024   # sampling.cu's THREADS


def _expect(what: str, ok: bool, *arrays: DeviceArray) -> None:
    if not ok:
        shapes = ", ".join(f"{a.shape} {a.dtype}" for a in arrays)
        raise ValueError(f"{what}: unexpected arguments {shapes}")


# What common/bench/profile.py reads to name this stage's kernels in a decode step's CUPTI record: kernel name (a name
# ending in "*" is a prefix) -> the group whose floor, computed there from the model's shapes, it is held to.
# "gemm": a GEMM, taking the next of the step's fixed order as cuBLAS's kernels do; None: never in a decode step.
PROFILE_GROUPS = {
    "embedding_gather": "embedding", "checksum_u16": None, "rms_norm": "norms", "add_rms_norm": "norms",
    "rope_inplace": "rope", "kv_write": "kv_write", "silu_mul": "silu_mul", "attention_naive": "attention",
    "sample_tokens": "sample",
}


class Kernels:
    def __init__(self, gpu: Gpu):
        self.gpu = gpu

        def load(file: str, *names: str):
            module = KernelModule(KERNEL_DIR / file, gpu.arch)
            return [module.kernel(n) for n in names]

        self._embedding, = load("embedding.cu", "embedding_gather")
        self._checksum, = load("checksum.cu", "checksum_u16")
        self._rms_norm, self._add_rms_norm = load("rmsnorm.cu", "rms_norm", "add_rms_norm")
        self._rope, = load("rope.cu", "rope_inplace")
        self._silu_mul, = load("silu_mul.cu", "silu_mul")
        self._attention, = load("attention.cu", "attention_naive")
        self._kv_write, = load("kv_write.cu", "kv_write")
        self._sample, = load("sampling.cu", "sample_tokens")
        sms = gpu.device.properties.multiprocessor_count
        self._configs: dict[tuple, object] = {}
        self._checksum_config = self._config("checksum", 4 * sms, THREADS)

    def _config(self, key, grid, block):
        """A LaunchConfig per (kernel, shape), built on first use and kept."""
        from cuda.core import LaunchConfig

        config = self._configs.get((key, grid, block))
        if config is None:
            config = self._configs[(key, grid, block)] = LaunchConfig(grid=grid, block=block)
        return config

    def embedding(self, ids: DeviceArray, table: DeviceArray, out: DeviceArray) -> None:
        """out[t] = table[ids[t]].   ids (T,) i32, table (V, H) bf16, out (T, H) bf16. ids must be < V."""
        (T,), (_, H) = ids.shape, table.shape
        _expect("embedding", ids.dtype == "i32" and table.dtype == out.dtype == "bf16" and out.shape == (T, H)
                and H % 8 == 0, ids, table, out)
        self.gpu.launch(self._embedding, self._config("embedding", (T, -(-H // (8 * THREADS))), THREADS),
                        ids.arg, table.arg, out.arg, np.int32(H))

    def checksum(self, words: DeviceArray, out: DeviceArray) -> None:
        """out[0] += sum_i (w_i + 1)(2i + 1) mod 2^64 over the array's 16-bit words (zero out first)."""
        if words.nbytes % 2 or out.dtype != "u64":
            raise ValueError(f"checksum: {words.nbytes} bytes (must be even) into {out.dtype} (must be u64)")
        self.gpu.launch(self._checksum, self._checksum_config, words.arg, np.uint64(words.nbytes // 2), out.arg)

    def rms_norm(self, x: DeviceArray, w: DeviceArray, y: DeviceArray, eps: float) -> None:
        """y = x / rms(x) * w, row by row.   x, y (T, H) bf16, w (H,) bf16."""
        T, H = x.shape
        _expect("rms_norm", x.dtype == w.dtype == y.dtype == "bf16" and w.shape == (H,) and y.shape == (T, H),
                x, w, y)
        self.gpu.launch(self._rms_norm, self._config("norm", T, THREADS), x.arg, w.arg, y.arg, np.int32(H),
                        np.float32(eps))

    def add_rms_norm(self, x: DeviceArray, d: DeviceArray, w: DeviceArray, y: DeviceArray, eps: float) -> None:
        """x += d (in place, bf16), then y = rms_norm(x) * w.   x, d, y (T, H) bf16, w (H,) bf16."""
        T, H = x.shape
        _expect("add_rms_norm", x.dtype == d.dtype == w.dtype == y.dtype == "bf16" and w.shape == (H,)
                and d.shape == y.shape == (T, H), x, d, w, y)
        self.gpu.launch(self._add_rms_norm, self._config("norm", T, THREADS), x.arg, d.arg, w.arg, y.arg,
                        np.int32(H), np.float32(eps))

    def rope(self, qkv: DeviceArray, cos: DeviceArray, sin: DeviceArray, positions: DeviceArray, n_heads: int,
             head_dim: int) -> None:
        """Rotate the first n_heads heads of each qkv row (T, row_stride) bf16 by its position positions[t]
        (T,) i32, each < max_len. cos, sin (max_len, hd/2) f32."""
        T, stride = qkv.shape
        _expect("rope", qkv.dtype == "bf16" and cos.dtype == sin.dtype == "f32" and cos.shape == sin.shape
                and cos.shape[1] == head_dim // 2 and positions.shape == (T,) and positions.dtype == "i32"
                and n_heads * head_dim <= stride, qkv, cos, sin, positions)
        self.gpu.launch(self._rope, self._config("rope", T, THREADS), qkv.arg, cos.arg, sin.arg, positions.arg,
                        np.int32(n_heads), np.int32(head_dim), np.int32(stride))

    def silu_mul(self, gate_up: DeviceArray, act: DeviceArray) -> None:
        """act = silu(gate) * up.   gate_up (T, 2I) bf16 rows [gate | up], act (T, I) bf16, I even."""
        T, I2 = gate_up.shape
        _expect("silu_mul", gate_up.dtype == act.dtype == "bf16" and act.shape == (T, I2 // 2) and I2 % 4 == 0,
                gate_up, act)
        self.gpu.launch(self._silu_mul, self._config("silu", (-(-I2 // (4 * THREADS)), T), THREADS),
                        gate_up.arg, act.arg, np.int32(I2 // 2))

    def kv_write(self, qkv: DeviceArray, k_cache: DeviceArray, v_cache: DeviceArray, slot_mapping: DeviceArray,
                 n_heads: int, n_kv_heads: int, head_dim: int) -> None:
        """K[slot_mapping[t]], V[slot_mapping[t]] = the k and v heads of qkv row t, skipping -1.
        qkv (T, stride) bf16 [q | k | v], slot_mapping (T,) i32, caches (B, max_len, nkv, hd) bf16."""
        T, stride = qkv.shape
        _expect("kv_write", qkv.dtype == k_cache.dtype == v_cache.dtype == "bf16" and len(k_cache.shape) == 4
                and k_cache.shape == v_cache.shape and k_cache.shape[2:] == (n_kv_heads, head_dim)
                and slot_mapping.shape == (T,) and slot_mapping.dtype == "i32"
                and stride >= (n_heads + 2 * n_kv_heads) * head_dim and head_dim % 2 == 0,
                qkv, k_cache, v_cache, slot_mapping)
        self.gpu.launch(self._kv_write, self._config("kv_write", T, THREADS), qkv.arg, k_cache.arg, v_cache.arg,
                        slot_mapping.arg, np.int32(n_heads), np.int32(n_kv_heads), np.int32(head_dim), np.int32(stride))

    def attention(self, qkv: DeviceArray, k_cache: DeviceArray, v_cache: DeviceArray, scores: DeviceArray,
                  out: DeviceArray, positions: DeviceArray, rows_per_seq: int, first_seq: int, max_keys: int,
                  n_heads: int, n_kv_heads: int, head_dim: int) -> None:
        """Causal GQA attention of each row r over keys 0..positions[r] of sequence first_seq + r / rows_per_seq.
        qkv (R, stride) bf16 (queries = the first nh heads), positions (R,) i32 (each < max_keys), caches
        (B, max_len, nkv, hd) bf16, scores (>= nh*R*max_keys,) f32 scratch, out (R, nh*hd) bf16."""
        R, stride = qkv.shape
        B, max_len = k_cache.shape[:2]
        _expect("attention", qkv.dtype == out.dtype == k_cache.dtype == v_cache.dtype == "bf16"
                and scores.dtype == "f32" and scores.size >= n_heads * R * max_keys and max_keys <= max_len
                and positions.shape == (R,) and positions.dtype == "i32"
                and out.shape == (R, n_heads * head_dim) and stride >= n_heads * head_dim
                and k_cache.shape == v_cache.shape == (B, max_len, n_kv_heads, head_dim)
                and R % rows_per_seq == 0 and 0 <= first_seq and first_seq + R // rows_per_seq <= B
                and n_heads % n_kv_heads == 0 and THREADS % head_dim == 0 and head_dim % 2 == 0,
                qkv, k_cache, v_cache, scores, out, positions)
        self.gpu.launch(self._attention, self._config("attention", (R, n_heads), THREADS), qkv.arg, k_cache.arg,
                        v_cache.arg, scores.arg, out.arg, positions.arg, np.int32(R), np.int32(rows_per_seq),
                        np.int32(first_seq), np.int32(max_keys), np.int32(max_len), np.int32(n_heads),
                        np.int32(n_kv_heads), np.int32(head_dim), np.int32(stride))

    def sample(self, logits: DeviceArray, temperature: DeviceArray, top_k: DeviceArray, top_p: DeviceArray,
               seed: DeviceArray, counter: DeviceArray, out: DeviceArray) -> None:
        """out[b] = the next token of row b of logits (B, V) f32: argmax where temperature[b] == 0, else a draw
        from softmax(logits[b] / temperature[b]) cut to top_k[b] / top_p[b], with the counter-based generator
        (seed[b], counter[b]). temperature, top_p (B,) f32; top_k, counter, out (B,) i32; seed (B,) u64."""
        B, V = logits.shape
        _expect("sample", logits.dtype == "f32" and out.dtype == "i32" and out.shape == counter.shape == (B,)
                and temperature.dtype == top_p.dtype == "f32" and top_k.dtype == counter.dtype == "i32"
                and seed.dtype == "u64" and temperature.shape == top_p.shape == top_k.shape == seed.shape == (B,),
                logits, temperature, top_k, top_p, seed, counter, out)
        self.gpu.launch(self._sample, self._config("sample", B, SAMPLER_THREADS), logits.arg, np.int32(V),
                        temperature.arg, top_k.arg, top_p.arg, seed.arg, counter.arg, out.arg)
