"""PromptPreparer's max_model_len: None is the default, every value given is checked (0 was taken as the default)."""
import pytest

from common.checkpoint import Checkpoint
from common.prompts import PromptError, PromptPreparer


@pytest.mark.parametrize("value", [0, 1, -3, 131072 + 1])
def test_max_model_len_outside_two_to_the_models_positions_is_refused(tiny_dir, value):
    with pytest.raises(PromptError, match=f"max_model_len={value} must be in \\[2, max_position_embeddings=131072\\]"):
        PromptPreparer(tiny_dir, Checkpoint(tiny_dir).config, value)


def test_none_is_the_default_and_a_value_given_is_kept(tiny_dir):
    config = Checkpoint(tiny_dir).config
    assert PromptPreparer(tiny_dir, config).max_model_len == 4096
    assert PromptPreparer(tiny_dir, config, 2).max_model_len == 2
