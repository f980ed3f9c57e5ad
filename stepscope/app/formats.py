"""Numbers as people read them, shared by the terminal and the dashboard.

One module, free of heavy imports, so that `stepscope show` and the run page print the
same figure the same way (a median of 216.9 ms is "216.9 ms" in both places, a share
of 0.843 is "84.3 %", a speed-up "1.42x (1.31–1.55x)").
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only for the hint: the CLI imports this module and stays off numpy
    from stepscope.optim_runner.speedup.speed import Speed


def missing(x: Any) -> bool:
    """None or NaN: what pandas hands back for an unknown figure."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt_value(value: Any) -> str:
    """A setting's value in words, never a Python repr: None is "—", a bool "yes"/"no",
    a count of 10,000 or more with its thousands grouped (a model's 124439808 parameters
    could not be read at a glance)."""
    if missing(value):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:,}"
    return str(value)


def fmt_s(s: float | None, digits: int | None = None) -> str:
    """Seconds in µs / ms / s, or with a fixed number of ``digits`` in seconds."""
    if missing(s):
        return "—"
    if digits is not None:
        return f"{s:.{digits}f} s"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def fmt_signed_s(s: float | None) -> str:
    """A change of time with its sign: '+948 µs', '-8.9 ms', '±0 µs' (``fmt_s``)."""
    if missing(s):
        return "—"
    return ("+" if s > 0 else "-" if s < 0 else "±") + fmt_s(abs(float(s)))


def fmt_num(x: float | None) -> str:
    return "—" if missing(x) else f"{x:.3g}" if x < 100 else f"{x:,.0f}"


def fmt_time(t: float | None, clock: bool = False, short: bool = False) -> str:
    if missing(t):
        return "—"
    fmt = "%H:%M:%S" if clock else "%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S"
    return datetime.fromtimestamp(t).strftime(fmt)


def fmt_bytes(x: float | None, digits: int | None = None) -> str:
    """Binary units; ``digits`` significant digits for narrow places (metric tiles)."""
    if missing(x):
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{x:.0f} B"
            if digits and abs(x) >= 10**digits:  # 1012 MiB: "1.01e+03" in .3g
                return f"{x:.0f} {unit}"
            return f"{x:.{digits}g} {unit}" if digits else f"{x:.1f} {unit}"
        x /= 1024
    return "—"  # unreachable: TiB takes everything left


def fmt_pct(share: float | None, digits: int = 1, none: str = "—") -> str:
    """A share (0..1) as a percentage: 0.123 is "12.3 %". ``none`` is how an unknown share
    reads: "—" on the page, "-" in the terminal's tables (a column of them lines up)."""
    return none if missing(share) else f"{share * 100:.{digits}f} %"


def steps_recorded(summary: dict[str, Any]) -> str:
    """ "189 steps, 2 training workers (94 + 94), 1 evaluation step in another process":
    the step count with the processes it came from (ranks, a hogwild job's workers, the
    parent that tested the model), adding up to the count, as the CLI and the Run page
    say it."""
    ranks = len(summary.get("ranks") or [])
    text = f"{summary['steps']} steps" + (f" over {ranks} ranks" if ranks > 1 else "")
    per_worker = summary.get("steps_per_worker") or {}
    if per_worker:
        plural = "s" if len(per_worker) > 1 else ""
        counts = " + ".join(str(n) for n in per_worker.values())
        text += f", {len(per_worker)} training worker{plural} ({counts})"
    evaluating = summary.get("evaluation_steps") or 0
    if evaluating:
        plural = "s" if evaluating > 1 else ""
        text += f", {evaluating} evaluation step{plural} in another process"
    return text


def fmt_ratio(x: float | None, none: str = "—") -> str:
    """A speed-up: 1.234 is "1.23x"."""
    return none if missing(x) else f"{x:.2f}x"


def fmt_ci(ci: list[float] | tuple[float, float] | None, none: str = "—") -> str:
    """A ratio's 95 % interval: "1.10–1.35x"."""
    return none if not ci else f"{ci[0]:.2f}–{ci[1]:.2f}x"


def speed_caption(speed: Speed) -> str:
    """The ratios in words, with what they were computed from."""
    head = speed.headline
    if head is None:
        return ""
    n = f"bootstrap over {head.n_baseline} and {head.n_candidate} timed steps"
    if speed.throughput is None:
        return (
            f"Median step time: {head.describe()}; {n}. No throughput ratio: not every "
            "step of both runs recorded its batch size."
        )
    text = f"Throughput: {head.describe()}, the ratio of mean seconds per sample; {n}"
    if speed.step_time is not None:
        text += f". Median step time: {speed.step_time.describe()}"
    return text + " (warm-up and profiled steps left out, each run resampled on its own)."


def guard_word(quality_ok: bool) -> str:
    """A candidate's cell under the guard's column ("loss", "tokens", "outputs"): "same"
    or "changed"; never "kept", which the tables keep for the fixes that are kept."""
    return "same" if quality_ok else "changed"


def guarded(result: dict[str, Any]) -> str:
    """What an experiment's quality guard judged, in a word: a generation job's generated
    tokens, an inference job's outputs, a training job's loss (``optim_runner/guards/guard.py``)."""
    return {"tokens": "tokens", "outputs": "outputs"}.get(result.get("guard") or "", "loss")
