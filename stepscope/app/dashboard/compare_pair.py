"""Which two runs Compare opens on, and which way round.

Compare reads "B vs A": a ratio above 1 means B is faster. So A must be the baseline,
or a fix that helped reads "0.80x slower". The rules, in order:

* **An experiment's baseline is A.** A run and a trial of an experiment on it (the
  trial's ``parent_run_id``): the run is A. Two trials of one baseline: the baseline
  arm's trial is A. Trials interleave, so by id a candidate trial is as often the older.
* **Otherwise the older run is A**: the usual story is "recorded, changed, recorded".
* **A partner of one run** ("Compare with…", ``?b=`` alone) is a run of the same
  command line first, then of the same script or name: a text-generation job against an
  MNIST job gives a ratio, and it means nothing. When no such run exists the page says
  the commands differ, rather than quietly comparing two different jobs.

Plain functions over ``data.run_relations``: the Runs page and the Compare page share them.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePath
from typing import Any

BASELINE_ARM = "baseline"  # the arm name of an experiment's baseline trials (trials.py)
_TRIAL_SUFFIX = re.compile(r"\s*\[[^\]]*\]$")  # "nanogpt [all #1]" -> "nanogpt"

SAME_COMMAND, SAME_JOB, OTHER_JOB = 0, 1, 2  # how close a partner is, best first

Runs = dict[int, dict[str, Any]]


def _is_baseline_of(x: dict[str, Any], y: dict[str, Any]) -> bool:
    """``x`` is what ``y`` was measured against: ``y`` is a trial on ``x``, or both are
    trials on one run and ``x`` is the baseline arm's."""
    if y.get("parent_run_id") == x["id"]:
        return True
    parent = x.get("parent_run_id")
    return (
        parent is not None
        and parent == y.get("parent_run_id")
        and x.get("arm") == BASELINE_ARM
        and y.get("arm") != BASELINE_ARM
    )


def ordered(x: int, y: int, runs: Runs) -> tuple[int, int]:
    """(A, B) for two runs: the baseline first when one is the other's, else the older."""
    rx, ry = runs.get(x), runs.get(y)
    if rx is not None and ry is not None:
        if _is_baseline_of(rx, ry):
            return x, y
        if _is_baseline_of(ry, rx):
            return y, x

    def age(i: int) -> tuple[float, int]:
        started = (runs.get(i) or {}).get("started_at")
        return (float(started) if started is not None else float("inf"), i)

    return (x, y) if age(x) <= age(y) else (y, x)


def script(command: list[str]) -> str | None:
    """The script or module a command runs (``train.py``, ``-m pkg.mod``), wherever it
    sits: the same script run from two folders is still the same job."""
    for i, arg in enumerate(command):
        if arg == "-m" and i + 1 < len(command):
            return command[i + 1]
        if str(arg).endswith(".py"):
            return PurePath(str(arg)).name
    return None


def job_name(name: str) -> str:
    """A run's name without a trial's arm suffix: trials are named after their baseline."""
    return _TRIAL_SUFFIX.sub("", str(name)).strip()


def closeness(x: dict[str, Any], y: dict[str, Any]) -> int:
    """SAME_COMMAND, SAME_JOB (same script or name, other arguments) or OTHER_JOB."""
    if x["command"] and x["command"] == y["command"]:
        return SAME_COMMAND
    sx, sy = script(x["command"]), script(y["command"])
    if (sx is not None and sx == sy) or job_name(x["name"]) == job_name(y["name"]):
        return SAME_JOB
    return OTHER_JOB


def partner(run_id: int, runs: Runs) -> int | None:
    """The run to compare ``run_id`` with: the same command first, then the same job;
    among equals a trial's own baseline, then the newest. None when it is the only run."""
    me = runs.get(run_id)
    others = [r for i, r in runs.items() if i != run_id]
    if me is None or not others:
        return None
    best = min(
        others,
        key=lambda r: (closeness(me, r), r["id"] != me.get("parent_run_id"), -r["id"]),
    )
    return int(best["id"])


def default_pair(runs: Runs, fixed: int | None, newest: list[int]) -> tuple[int, int] | None:
    """Compare's (A, B) when the URL names at most one run: ``fixed`` and its partner,
    else the two newest runs of ``newest``; ordered baseline first either way."""
    if fixed is not None:
        other = partner(fixed, runs)
        return None if other is None else ordered(fixed, other, runs)
    if len(newest) < 2:
        return None
    return ordered(newest[0], newest[1], runs)


def compare_with(run_id: int, runs: Runs) -> tuple[str, int, int] | None:
    """("Compare with #N (same command)", A, B) for a link from ``run_id``'s page; None
    when there is no other run."""
    other = partner(run_id, runs)
    if other is None:
        return None
    how = ("same command", "same script", "different command")[closeness(runs[run_id], runs[other])]
    a, b = ordered(run_id, other, runs)
    return f"Compare with #{other} ({how})", a, b


def command_note(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, bool] | None:
    """(what to say, whether it is another job altogether) when A's and B's commands
    differ; None when they are the same. Another job is worth a warning: its ratio
    compares two programs, not one change."""
    if a["command"] == b["command"]:
        return None
    text = (
        f"different command: A #{a['id']} runs `{shlex.join(map(str, a['command']))}`, "
        f"B #{b['id']} runs `{shlex.join(map(str, b['command']))}`"
    )
    return text, closeness(a, b) == OTHER_JOB
