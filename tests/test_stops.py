"""CPU: stop strings on streamed text (common/serve/stops.py): matched across deltas, never sent, and the text
that could start one held back only while it still could."""
import pytest

from common.serve.stops import StopMatcher


def run(stops, deltas):
    m, sent = StopMatcher(stops), []
    for d in deltas:
        sent.append(m.feed(d))
        if m.stopped:
            return sent, True
    return sent + [m.flush()], False


@pytest.mark.parametrize("stops, deltas, sent, stopped", [
    (["world"], ["Hello, wor", "ld!"], ["Hello, ", ""], True),            # split across two deltas
    (["world"], ["Hello, w", "o", "r", "l", "d"], ["Hello, ", "", "", "", ""], True),
    (["ab"], ["xa", "c", "a"], ["x", "ac", "", "a"], False),                # held "a" released when "c" follows
    (["\n\n", "END"], ["one\n", "two E", "ND more"], ["one", "\ntwo ", ""], True),
    (["stop"], ["no match here"], ["no match here", ""], False),
    ([], ["any", "thing"], ["any", "thing", ""], False),
    (["aa"], ["baaa"], ["b"], True),                                       # the first occurrence wins
])
def test_stop_strings(stops, deltas, sent, stopped):
    assert run(stops, deltas) == (sent, stopped)
    text = "".join(deltas)                        # what was sent is the text up to the first stop string
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    assert "".join(sent) == text[:min(hits)] if stopped else text
