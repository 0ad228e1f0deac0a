"""The host side of the GPU-copy check: the checksum must notice any changed, swapped or zeroed word."""
import numpy as np

from ..weights import host_checksum


def brute(words):
    return sum((int(w) + 1) * (2 * i + 1) for i, w in enumerate(words)) % 2**64


def test_matches_the_formula_and_chunking():
    w = np.random.default_rng(0).integers(0, 2**16, 1001, dtype=np.uint16)
    assert host_checksum(w) == brute(w) == host_checksum(w, chunk=7)


def test_detects_changes():
    w = np.random.default_rng(1).integers(1, 2**16, 4096, dtype=np.uint16)
    base = host_checksum(w)
    changed, swapped, zeroed = w.copy(), w.copy(), w.copy()
    changed[100] ^= 1
    swapped[[3, 4]] = swapped[[4, 3]] if swapped[3] != swapped[4] else (swapped[3], swapped[4] + 1)
    zeroed[-1] = 0
    assert len({base, host_checksum(changed), host_checksum(swapped), host_checksum(zeroed)}) == 4
