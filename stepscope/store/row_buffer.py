"""The in-job writer's buffers: bounded, so a store that is away never grows the job.

The job's threads append; the writer's flush thread takes what is there, and puts a
batch back when the store refused it. Each buffer has a cap: past it the oldest rows go,
and are counted, so the run's log can say what was lost once the store answers again.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class RowBuffer:
    """Rows of one kind waiting for the store (steps, samples, ...), at most ``cap``.

    ``append`` is the producers' side and stays a deque append (atomic under the GIL,
    no lock); ``take`` and ``put_back`` belong to the flush thread. A batch put back is
    kept apart from the rows added since, so the oldest rows are the ones dropped.
    """

    def __init__(self, name: str, cap: int) -> None:
        self.name = name  # as the run's log says it: "steps", "run updates", ...
        self.cap = cap
        self._new: deque[Any] = deque(maxlen=cap)  # a full deque drops its oldest row
        self._retry: list[Any] = []  # a refused batch, older than everything in _new
        # two counters: producers write one, the flush thread the other, never both
        self._overflowed = 0  # fell off a full deque between two flushes
        self._trimmed = 0  # cut from a batch put back and the rows added since

    def append(self, row: Any) -> None:
        if len(self._new) == self.cap:  # rare: the store has been away for a while
            self._overflowed += 1
        self._new.append(row)

    def take(self) -> list[Any]:
        """The rows to write now, oldest first: a batch put back, then the new rows; the
        oldest beyond the cap are dropped."""
        rows, self._retry = self._retry, []
        rows.extend(drain(self._new))
        excess = len(rows) - self.cap
        if excess > 0:
            self._trimmed += excess
            del rows[:excess]
        return rows

    def put_back(self, rows: list[Any]) -> None:
        """A batch the store refused: written first at the next flush."""
        self._retry = rows

    @property
    def dropped(self) -> int:
        """Rows dropped since the writer started."""
        return self._overflowed + self._trimmed


def drain(buffer: deque[Any]) -> list[Any]:
    """Pop what is there now; items appended meanwhile wait for the next flush."""
    out = []
    try:
        for _ in range(len(buffer)):
            out.append(buffer.popleft())
    except IndexError:
        pass
    return out


def drop_message(away_s: float | None, dropped: dict[str, int]) -> str:
    """The run's log line after an outage or a drop: how long the store was away and
    what was lost, by kind, steps always named (the rows every analysis reads), e.g.
    "the store was unreachable for 12 s: 340 samples and 0 steps dropped (buffers full)".
    """
    counts = {name: n for name, n in dropped.items() if n}
    counts.setdefault("steps", 0)
    what = [f"{n} {name}" for name, n in counts.items()]
    listed = what[0] if len(what) == 1 else ", ".join(what[:-1]) + " and " + what[-1]
    lost = f"{listed} dropped (buffers full)" if any(counts.values()) else "nothing was dropped"
    if away_s is None:
        return lost
    return f"the store was unreachable for {away_s:.0f} s: {lost}"
