"""Stop strings on the detokenised text, as OpenAI: the text stops just before the first stop string, which is
never sent. A stop string can span tokens, so the tail of the text that could still be the start of one is held
back until the next delta settles it.

    text so far "Hello, wor", stop "world"  ->  send "Hello, ", hold "wor"
    next delta "ld!"                         ->  match: send nothing more, finish with reason "stop"
"""
from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]):
        self.stops = stops
        self._held = ""          # text received but not sent: it may be the start of a stop string
        self.stopped = False

    def feed(self, delta: str) -> str:
        """The part of `delta` (with what was held) that is safe to send. After a match, `stopped` is set and
        the text up to the stop string is returned; nothing after it ever is."""
        if not self.stops:
            return delta
        text = self._held + delta
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return text[:min(hits)]
        keep = max((k for s in self.stops for k in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:k])), default=0)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        """The request ended without a match: what was held back is plain text after all."""
        rest, self._held = self._held, ""
        return rest
