"""Stop strings on streamed text: release text as it comes, holding back only what could start a stop."""

from __future__ import annotations


class StopText:
    """Accumulates generated text; :meth:`push` returns the text safe to send and whether a stop string
    was hit (the text is then cut before it, as OpenAI does)."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, piece: str) -> str:
        if self.stopped:
            return ""
        self.text += piece
        hits = [i for i in (self.text.find(s, max(0, self.sent - self.hold)) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self.text = self.text[: min(hits)]
            return self._release(len(self.text))
        return self._release(len(self.text) - self.hold)

    def flush(self) -> str:
        """The held-back rest (at the end of generation)."""
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        upto = max(upto, self.sent)
        out = self.text[self.sent : upto]
        self.sent = upto
        return out
