import json

import pytest

from common.config import ConfigError, LlamaConfig, read_generation_stop_ids
from common.synthetic import PRESETS

REAL_1B = PRESETS["llama-3.2-1b"].to_hf_dict()


def test_1b_preset_has_the_real_parameter_count():
    assert PRESETS["llama-3.2-1b"].num_parameters() == 1_235_814_400


def test_8b_preset_has_the_real_parameter_count_and_rope():
    cfg = PRESETS["llama-3.1-8b"]
    assert cfg.num_parameters() == 8_030_261_248 and not cfg.tie_word_embeddings
    assert cfg.rope_scaling.factor == 8.0 and cfg.head_dim == 128


def test_round_trip_through_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(REAL_1B))
    cfg = LlamaConfig.from_file(tmp_path)
    assert cfg == PRESETS["llama-3.2-1b"]
    assert cfg.rope_scaling.factor == 32.0 and cfg.eos_token_ids == (128001, 128008, 128009)


def test_transformers5_rope_parameters_layout():
    raw = {k: v for k, v in REAL_1B.items() if k not in ("rope_scaling", "rope_theta")}
    raw["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, **{
        k: v for k, v in REAL_1B["rope_scaling"].items() if k != "rope_type"}}
    assert LlamaConfig.from_dict(raw) == PRESETS["llama-3.2-1b"]


@pytest.mark.parametrize("change, message", [
    ({"architectures": ["MistralForCausalLM"]}, "architecture"),
    ({"model_type": "gpt2"}, "architecture"),
    ({"num_key_value_heads": 7}, "not a multiple of num_key_value_heads"),
    ({"head_dim": 63}, "must be even"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 32.0}}, "lacks field 'low_freq_factor'"),
    ({"vocab_size": "big"}, "'vocab_size' must be an integer"),
    ({"eos_token_id": 999999}, "outside the vocabulary"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_bad_configs_name_the_field(change, message):
    with pytest.raises(ConfigError, match=message):
        LlamaConfig.from_dict({**REAL_1B, **change}, source="x/config.json")


def test_missing_field_and_missing_file(tmp_path):
    raw = dict(REAL_1B)
    del raw["intermediate_size"]
    with pytest.raises(ConfigError, match="'intermediate_size' is missing"):
        LlamaConfig.from_dict(raw)
    with pytest.raises(ConfigError, match="config.json: not found"):
        LlamaConfig.from_file(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        LlamaConfig.from_file(tmp_path)


def test_no_rope_scaling_and_default_head_dim():
    raw = {**REAL_1B, "rope_scaling": None}
    del raw["head_dim"]
    cfg = LlamaConfig.from_dict(raw)
    assert cfg.rope_scaling is None and cfg.head_dim == 64


def test_generation_config_stop_ids(tmp_path):
    assert read_generation_stop_ids(tmp_path) == ()
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128009]}))
    assert read_generation_stop_ids(tmp_path) == (128001, 128009)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(ConfigError, match="eos_token_id"):
        read_generation_stop_ids(tmp_path)
