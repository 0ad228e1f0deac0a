"""CPU: the torch float32 reference (common/reference_torch.py, for prompts too long for numpy) equals the numpy
reference on the last positions, whatever the query block, tied or untied, GQA or not."""
import numpy as np
import pytest

from common.checkpoint import Checkpoint
from common.reference import ReferenceModel

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("fixture, chunk", [("tiny_dir", 7), ("tiny_untied_dir", 64), ("small_dir", 5)])
def test_last_logits_equal_the_numpy_reference(fixture, chunk, request):
    from common.reference_torch import last_logits

    checkpoint = Checkpoint(request.getfixturevalue(fixture))
    ids = [128000] + np.random.default_rng(3).integers(0, 128000, 40).tolist()
    want = ReferenceModel(checkpoint).forward(ids)[-9:]
    got = last_logits(checkpoint, ids, keep=9, device="cpu", query_chunk=chunk)
    assert got.shape == want.shape
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def test_keep_outside_the_prompt_is_refused(tiny_dir):
    from common.reference_torch import last_logits

    with pytest.raises(ValueError, match="keep=5"):
        last_logits(Checkpoint(tiny_dir), [128000, 1, 2], keep=5, device="cpu")
