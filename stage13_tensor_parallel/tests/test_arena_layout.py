"""CPU: the weight arena puts each layer's q/k/v and gate/up back to back (fusion as a view), every tensor once."""
from common.checkpoint import Checkpoint
from ..weights import ALIGN, FUSED, arena_layout


def test_fused_groups_are_adjacent_and_nothing_overlaps(tiny_sharded_dir):
    ckpt = Checkpoint(tiny_sharded_dir)
    offsets, total = arena_layout(ckpt)
    assert set(offsets) == set(ckpt.entries)
    spans = sorted((offsets[n], offsets[n] + e.nbytes) for n, e in ckpt.entries.items())
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])) and spans[-1][1] <= total
    for layer in range(ckpt.config.num_hidden_layers):
        for members in FUSED.values():
            names = [f"model.layers.{layer}.{m}.weight" for m in members]
            assert offsets[names[0]] % ALIGN == 0
            for a, b in zip(names, names[1:]):
                assert offsets[b] == offsets[a] + ckpt.entries[a].nbytes
