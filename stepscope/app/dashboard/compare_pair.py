"""Which two runs Compare opens on, and which way round.

Compare reads "B vs A": a ratio above 1 means B is faster. So A must be the baseline,
or a fix that helped reads "0.80x slower". The rules, in order:

* **An experiment's baseline is A.** A run and a trial of an experiment on it (the
  trial's ``parent_run_id``): the run is A. Two trials of one baseline: the baseline
  arm's trial is A. Trials interleave, so by id a candidate trial is as often the older.
* **Otherwise the older run is A**: the usual story is "recorded, changed, recorded".
* **A partner of one run** ("Compare with…", ``?b=`` alone) is a run of the same
  command line in the same working folder first, then of the same script (its path
  resolved against the run's folder: every example is ``main.py``, and two folders' are
  two programs). When no such run exists there is none: a text-generation job against an
  MNIST job gives a ratio, and it means nothing.
* **Compare opened on no run** takes the newest run that has such a partner; only when no
  run has one does it fall back to the two newest, shown as different programs.

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


def _script_index(command: list[str]) -> int | None:
    """Where the script (``train.py``) or module (``-m pkg.mod``) sits in a command."""
    for i, arg in enumerate(command):
        if arg == "-m" and i + 1 < len(command):
            return i + 1
        if str(arg).endswith(".py"):
            return i
    return None


def script(command: list[str]) -> str | None:
    """The script or module a command runs (``train.py``, ``-m pkg.mod``), as typed."""
    i = _script_index(command)
    return None if i is None else str(command[i])


def script_path(run: dict[str, Any]) -> str | None:
    """The script a run ran, resolved against its working folder (``/ex/mnist/main.py``);
    a module is its name. None when there is no script, or a relative one and no folder:
    then nothing tells two ``main.py`` apart."""
    i = _script_index(run["command"])
    if i is None:
        return None
    text = str(run["command"][i])
    if i > 0 and run["command"][i - 1] == "-m":
        return f"-m {text}"
    path = PurePath(text)
    if path.is_absolute():
        return str(path)
    folder = run.get("cwd")
    return str(PurePath(str(folder)) / path) if folder else None


def job_name(name: str) -> str:
    """A run's name without a trial's arm suffix: trials are named after their baseline."""
    return _TRIAL_SUFFIX.sub("", str(name)).strip()


def closeness(x: dict[str, Any], y: dict[str, Any]) -> int:
    """SAME_COMMAND (one command line in one working folder), SAME_JOB (the same script
    path, other arguments or folder) or OTHER_JOB. A trial runs its baseline's command
    in its folder, so it is the same command. A name alone proves nothing: ``main``."""
    same_folder = bool(x.get("cwd")) and x.get("cwd") == y.get("cwd")
    if x["command"] and x["command"] == y["command"] and same_folder:
        return SAME_COMMAND
    sx, sy = script_path(x), script_path(y)
    if sx is not None and sx == sy:
        return SAME_JOB
    return OTHER_JOB


def no_folder(x: dict[str, Any], y: dict[str, Any]) -> list[int]:
    """The runs of a pair that recorded no working folder (an old or imported run)."""
    return [int(r["id"]) for r in (x, y) if not r.get("cwd")]


def differences(x: dict[str, Any], y: dict[str, Any]) -> list[str]:
    """What differs between two runs' programs, one line each (script, arguments,
    folder), for a page that compares different programs: the reader sees why no
    ratio is given."""
    out = []
    sx, sy = script_path(x) or script(x["command"]), script_path(y) or script(y["command"])
    if sx != sy:
        out.append(f"script: {sx or 'none'} → {sy or 'none'}")
    ix, iy = _script_index(x["command"]), _script_index(y["command"])
    ax = x["command"][ix + 1 :] if ix is not None else x["command"]
    ay = y["command"][iy + 1 :] if iy is not None else y["command"]
    if ax != ay:
        out.append(
            f"arguments: {shlex.join(map(str, ax)) or 'none'} → {shlex.join(map(str, ay)) or 'none'}"
        )
    if x.get("cwd") != y.get("cwd"):
        out.append(f"folder: {x.get('cwd') or 'not recorded'} → {y.get('cwd') or 'not recorded'}")
    return out


def partner(run_id: int, runs: Runs) -> int | None:
    """The run to compare ``run_id`` with: the same command in the same folder first,
    then the same script; among equals a trial's own baseline, then the newest. None when
    no other run is of the same program."""
    me = runs.get(run_id)
    if me is None:
        return None
    others = [r for i, r in runs.items() if i != run_id and closeness(me, r) != OTHER_JOB]
    if not others:
        return None
    best = min(
        others,
        key=lambda r: (closeness(me, r), r["id"] != me.get("parent_run_id"), -r["id"]),
    )
    return int(best["id"])


def default_pair(runs: Runs, fixed: int | None, newest: list[int]) -> tuple[int, int] | None:
    """Compare's (A, B) when the URL names at most one run: ``fixed`` and its partner
    (else ``fixed`` and the newest other run, which the page shows as another program);
    with none named, the two newest when they are one program, else the newest run that
    has a partner, else the two newest.
    Ordered baseline first either way."""
    if fixed is not None:
        other = partner(fixed, runs)
        if other is None:
            rest = [i for i in newest if i != fixed]
            return ordered(fixed, rest[0], runs) if rest else None
        return ordered(fixed, other, runs)
    if len(newest) < 2:
        return None
    first, second = runs.get(newest[0]), runs.get(newest[1])
    if first and second and closeness(first, second) != OTHER_JOB:
        return ordered(newest[0], newest[1], runs)
    for i in newest:
        other = partner(i, runs)
        if other is not None:
            return ordered(i, other, runs)
    return ordered(newest[0], newest[1], runs)


def compare_with(run_id: int, runs: Runs) -> tuple[str, int, int] | None:
    """("Compare with #N (same command)", A, B) for a link from ``run_id``'s page; None
    when no other run is of the same program."""
    other = partner(run_id, runs)
    if other is None:
        return None
    how = ("same command", "same script")[closeness(runs[run_id], runs[other])]
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
