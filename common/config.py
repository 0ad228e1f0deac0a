"""LlamaConfig: a checkpoint's config.json, validated, plus the tensor names and shapes it implies.

Reads the Hugging Face layout of Llama 3.2 (rope_theta + rope_scaling) and the transformers 5 layout
(rope_parameters). Anything this engine cannot run correctly is an error that names the file and field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_ROPE_TYPES = ("default", "llama3")


class ConfigError(ValueError):
    """config.json (or generation_config.json) is missing, malformed or describes a model we cannot run."""


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3 frequency scaling: long wavelengths are stretched by `factor`, short ones kept, a smooth ramp between."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    source: str = field(default="<dict>", compare=False)

    # ------------------------------------------------------------------ reading
    @classmethod
    def from_file(cls, path: str | Path) -> "LlamaConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise ConfigError(f"{path}: not found (a checkpoint folder needs config.json)")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict, source: str = "<dict>") -> "LlamaConfig":
        def need(name, kind=int):
            if name not in raw:
                raise ConfigError(f"{source}: field {name!r} is missing")
            value = raw[name]
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"{source}: field {name!r} must be an integer, got {value!r}")
            if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ConfigError(f"{source}: field {name!r} must be a number, got {value!r}")
            return kind(value)

        archs = raw.get("architectures") or []
        if raw.get("model_type", "llama") != "llama" or (archs and archs != ["LlamaForCausalLM"]):
            raise ConfigError(f"{source}: architecture {archs or raw.get('model_type')!r} is not supported; "
                              "this engine runs LlamaForCausalLM (model_type 'llama')")
        if raw.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{source}: field 'hidden_act' is {raw['hidden_act']!r}; only 'silu' is supported")
        for flag in ("attention_bias", "mlp_bias"):
            if raw.get(flag, False):
                raise ConfigError(f"{source}: field {flag!r} is true; Llama 3 has no biases "
                                  "and neither does this engine")

        hidden, heads = need("hidden_size"), need("num_attention_heads")
        kv_heads = need("num_key_value_heads") if "num_key_value_heads" in raw else heads
        head_dim = need("head_dim") if raw.get("head_dim") is not None else (hidden // heads if heads else 0)
        rope_theta, rope_scaling = _read_rope(raw, source)
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        cfg = cls(
            vocab_size=need("vocab_size"), hidden_size=hidden, intermediate_size=need("intermediate_size"),
            num_hidden_layers=need("num_hidden_layers"), num_attention_heads=heads, num_key_value_heads=kv_heads,
            head_dim=head_dim, rms_norm_eps=need("rms_norm_eps", float), rope_theta=rope_theta,
            rope_scaling=rope_scaling, max_position_embeddings=need("max_position_embeddings"),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=raw.get("bos_token_id"), eos_token_ids=eos_ids, source=source,
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        s = self.source
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{s}: field {name!r} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"{s}: num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                              f"num_key_value_heads ({self.num_key_value_heads}); GQA needs whole groups")
        if self.head_dim % 2:
            raise ConfigError(f"{s}: head_dim ({self.head_dim}) must be even: RoPE rotates pairs of dimensions")
        if self.head_dim % 8 or self.hidden_size % 8:
            raise ConfigError(f"{s}: head_dim ({self.head_dim}) and hidden_size ({self.hidden_size}) must be "
                              "multiples of 8 (16-byte rows for the kernels' vector loads)")
        if not self.rms_norm_eps > 0:
            raise ConfigError(f"{s}: field 'rms_norm_eps' must be positive, got {self.rms_norm_eps}")
        if not self.rope_theta > 0:
            raise ConfigError(f"{s}: field 'rope_theta' must be positive, got {self.rope_theta}")
        r = self.rope_scaling
        if r is not None and not (r.factor >= 1 and 0 < r.low_freq_factor < r.high_freq_factor
                                  and r.original_max_position_embeddings > 0):
            raise ConfigError(f"{s}: rope_scaling {r} needs factor >= 1, 0 < low_freq_factor < high_freq_factor "
                              "and original_max_position_embeddings > 0")
        for tid in (*self.eos_token_ids, *(() if self.bos_token_id is None else (self.bos_token_id,))):
            if not (isinstance(tid, int) and 0 <= tid < self.vocab_size):
                raise ConfigError(f"{s}: token id {tid!r} (bos/eos) is outside the vocabulary of {self.vocab_size}")

    # ------------------------------------------------------------------ derived
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a Hugging Face checkpoint of this config holds, in file naming, with its shape."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        shapes = {"model.embed_tokens.weight": (v, h)}
        for layer in range(self.num_hidden_layers):
            p = f"model.layers.{layer}."
            shapes |= {
                p + "input_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (self.q_size, h),
                p + "self_attn.k_proj.weight": (self.kv_size, h),
                p + "self_attn.v_proj.weight": (self.kv_size, h),
                p + "self_attn.o_proj.weight": (h, self.q_size),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
            }
        shapes["model.norm.weight"] = (h,)
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (v, h)
        return shapes

    def num_parameters(self) -> int:
        return sum(_prod(s) for s in self.tensor_shapes().values())

    def to_hf_dict(self) -> dict:
        """The config.json a Hugging Face checkpoint of this model carries (rope in the Llama 3.2 release layout)."""
        r = self.rope_scaling
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "initializer_range": 0.02,
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": None if r is None else {
                "rope_type": "llama3", "factor": r.factor, "low_freq_factor": r.low_freq_factor,
                "high_freq_factor": r.high_freq_factor,
                "original_max_position_embeddings": r.original_max_position_embeddings},
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings, "torch_dtype": "bfloat16", "use_cache": True,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
        }


def _read_rope(raw: dict, source: str) -> tuple[float, RopeScaling | None]:
    params = raw.get("rope_parameters")  # transformers >= 5 writes this instead of rope_theta + rope_scaling
    scaling = raw.get("rope_scaling", params)
    theta = raw.get("rope_theta", (params or {}).get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ConfigError(f"{source}: field 'rope_theta' must be a number, got {theta!r}")
    if scaling is None:
        return float(theta), None
    if not isinstance(scaling, dict):
        raise ConfigError(f"{source}: field 'rope_scaling' must be an object or null, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(f"{source}: rope_scaling type {kind!r} is not supported (supported: "
                          f"{', '.join(SUPPORTED_ROPE_TYPES)})")
    if kind == "default":
        return float(theta), None
    try:
        return float(theta), RopeScaling(
            factor=float(scaling["factor"]), low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]))
    except KeyError as e:
        raise ConfigError(f"{source}: rope_scaling of type 'llama3' lacks field {e.args[0]!r}") from None


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def read_generation_stop_ids(folder: str | Path) -> tuple[int, ...]:
    """eos ids from generation_config.json (a real Llama 3.2 Instruct lists 128001, 128008, 128009), or ()."""
    path = Path(folder) / "generation_config.json"
    if not path.exists():
        return ()
    try:
        eos = json.loads(path.read_text()).get("eos_token_id")
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ConfigError(f"{path}: field 'eos_token_id' must be an integer or a list of integers, got {eos!r}")
    return tuple(ids)
