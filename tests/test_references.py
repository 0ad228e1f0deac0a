"""common/references.py: the reference's logits asked once a process, read-only, asked afresh where the checkpoint
changed (its GPU parts, HF's and torch's, run in every stage's GPU model tests)."""
import os

import numpy as np
import pytest

from common.checkpoint import Checkpoint
from common.reference import ReferenceModel
from common.references import reference_logits


def test_the_reference_is_asked_once_and_its_answer_cannot_be_written(tiny_dir):
    ids = [5, 17, 300, 9000]
    first = reference_logits(tiny_dir, ids)
    np.testing.assert_array_equal(first, ReferenceModel(Checkpoint(tiny_dir)).forward(ids))
    assert reference_logits(tiny_dir, np.array(ids)) is first                 # the same question, one answer
    assert reference_logits(tiny_dir, ids[:3]) is not first
    with pytest.raises(ValueError, match="read-only"):
        first[0, 0] = 0.0


def test_a_checkpoint_changed_in_place_is_asked_afresh(tiny_dir):
    ids = [1, 2, 3]
    first = reference_logits(tiny_dir, ids)
    weights = next(p for p in tiny_dir.iterdir() if p.suffix == ".safetensors")
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    try:
        assert reference_logits(tiny_dir, ids) is not first
    finally:
        os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
