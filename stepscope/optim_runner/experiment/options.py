"""An experiment's options, declared once: ``ExperimentOptions``.

Every path that starts an experiment used to write its options out by hand (the CLI's
arguments, ``cmd_optimize``, ``run_experiment``, ``background.start_experiment`` and
the background process's JSON), and they drifted: an option added to one path was
silently missing on another. Each field here carries what every path needs (its CLI
flag, metavar, help text, type, and for the dashboard's Optimize form its ``FormInput``:
label, help, default, bounds), and the paths are derived from the fields:
``add_arguments`` (argparse), ``from_args``, ``to_json`` / ``from_json`` (the
background process's request file), ``form_input`` (the form's widgets,
``app/dashboard/views/optimize/option_inputs.py``).

No heavy import here: ``stepscope --help`` builds its parser from these fields.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stepscope.optim_runner.experiment.adaptive import DEFAULT_BUDGET_MIN, MIN_TRIALS, check_budget
from stepscope.optim_runner.guards.limits import DEFAULT_MIN_AGREEMENT, DEFAULT_OUTPUT_TOLERANCE
from stepscope.optim_runner.verdict.memory_goal import (
    DEFAULT_MAX_SLOWDOWN,
    GOALS,
    parse_max_slowdown,
)

DEFAULT_STEPS = 30
DEFAULT_TRIALS = 3
MIN_STEPS = 3  # the warm-up (``step_stats.default_warmup``: 1 of 3) and two timed steps
MIN_FORM_STEPS = 4  # the warm-up is left out of every trial: fewer leave nothing to time


def parse_fix_ids(text: str) -> tuple[str, ...] | None:
    """``"a, b"`` as ``("a", "b")``; empty text: None (the recommended fixes)."""
    if not text:
        return None
    return tuple(f.strip() for f in text.split(",") if f.strip())


def parse_goal(text: str) -> str:
    if text not in GOALS:
        raise argparse.ArgumentTypeError(f"{text!r}: one of {', '.join(GOALS)}")
    return text


def parse_slowdown_arg(text: str) -> float:
    """``parse_max_slowdown`` for argparse: its one line as the argument's error."""
    try:
        return parse_max_slowdown(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_size(steps: int, trials: int) -> None:
    """Refused before anything runs: ``--steps 2`` left one timed step after the warm-up,
    and every trial then failed with "too few steps recorded"."""
    if steps < MIN_STEPS or trials < 1:
        raise ValueError(
            f"an experiment needs at least {MIN_STEPS} steps per trial (the first is "
            "warm-up, left out; two are timed) and 1 trial per arm"
        )


@dataclass(frozen=True)
class FormInput:
    """How the dashboard's Optimize form shows an option: a toggle for a bool field, a
    number input otherwise. ``default`` None: the field's own default; ``help`` None:
    the CLI's help text."""

    label: str
    help: str | None = None
    default: Any = None
    min_value: float | None = None
    max_value: float | None = None
    step: float | None = None
    format: str | None = None


def _option(
    flag: str | None = None,
    help: str = "",
    *,
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    form: FormInput | None = None,
) -> dict[str, Any]:
    """A field's metadata. ``flag`` None: no CLI argument (set from Python only);
    ``parse``: argparse's ``type`` (None: the text; a bool field is a store_true flag);
    ``form``: how the dashboard's Optimize form sets it (None: it does not; ``fixes``
    is set by the form's checkboxes, one per fix)."""
    return {"flag": flag, "help": help, "parse": parse, "metavar": metavar, "form": form}


@dataclass(frozen=True)
class ExperimentOptions:
    """What an experiment tries and how (the store, run and progress are not options).

    The field order is the order of ``stepscope optimize --help``.
    """

    fixes: tuple[str, ...] | None = field(
        default=None,
        metadata=_option(
            "--fixes",
            "fixes to try (default: recommended)",
            parse=parse_fix_ids,
            metavar="ID,...",
            form=FormInput("fixes", help="one checkbox per fix the diagnosis recommends"),
        ),
    )
    steps: int = field(
        default=DEFAULT_STEPS,
        metadata=_option(
            "--steps",
            f"steps per trial (default {DEFAULT_STEPS})",
            parse=int,
            form=FormInput(
                "steps per trial",
                "the job stops itself after this many steps; warm-up steps are left out",
                min_value=MIN_FORM_STEPS,
                max_value=100_000,
            ),
        ),
    )
    trials: int = field(
        default=DEFAULT_TRIALS,
        metadata=_option(
            "--trials",
            f"most trials per arm (default {DEFAULT_TRIALS}); an arm whose verdict is clear "
            f"after {MIN_TRIALS} trial{'' if MIN_TRIALS == 1 else 's'} stops early, unless "
            "--full",
            parse=int,
            form=FormInput(
                "trials per arm",
                "each arm (baseline, each candidate) runs this many times, interleaved",
                min_value=1,
                max_value=20,
            ),
        ),
    )
    budget_min: float | None = field(
        default=None,
        metadata=_option(
            "--budget",
            "end the experiment with what it has rather than start a round that would end "
            f"past MINUTES (default {DEFAULT_BUDGET_MIN:g})",
            parse=float,
            metavar="MINUTES",
        ),
    )
    full: bool = field(
        default=False,
        metadata=_option(
            "--full",
            "every candidate gets every trial (no early stops, no budget): the fixed design",
        ),
    )
    timeout_s: float | None = field(
        default=None,
        metadata=_option(
            "--timeout",
            "seconds before a trial counts as hung (default: 5x the baseline, >= 60)",
            parse=float,
            metavar="S",
        ),
    )
    stall_s: float | None = field(
        default=None,
        metadata=_option(
            "--stall",
            "seconds without a new step, once a trial has stepped, before it counts as "
            "hung (default: 10x the baseline's longest wait between steps, >= 60)",
            parse=float,
            metavar="S",
        ),
    )
    allow_numerics: bool = field(
        default=False,
        metadata=_option(
            "--allow-numerics",
            "also try fixes that change what the model computes (e.g. larger_batch)",
            form=FormInput(
                "Allow numerics to change",
                "also offer fixes that change what the model computes (bf16, TF32, a larger "
                "batch): a different result is your call; the quality guard still compares "
                "the loss with the baseline's",
            ),
        ),
    )
    keep_explicit: bool = field(
        default=False,
        metadata=_option(
            "--keep-explicit",
            "keep values the script set explicitly (num_workers=0 passed by the script "
            "stays 0); by default a fix overrides them and the trial's log says what it "
            "replaced",
            form=FormInput(
                "Keep values my script set explicitly",
                "on: a value the script passes itself (num_workers=0) stays as it is; off: a "
                "fix overrides it and the trial's log says what it replaced",
            ),
        ),
    )
    output_tolerance: float | None = field(
        default=None,
        metadata=_option(
            "--output-tolerance",
            "inference jobs: largest difference of a regression output from the baseline's, "
            f"relative to its scale (default {DEFAULT_OUTPUT_TOLERANCE:g})",
            parse=float,
            metavar="R",
            form=FormInput(
                "largest relative difference",
                "of regression outputs, relative to the baseline output's largest magnitude",
                default=DEFAULT_OUTPUT_TOLERANCE,
                min_value=0.0,
                max_value=10.0,
                step=0.005,
                format="%.4f",
            ),
        ),
    )
    min_agreement: float | None = field(
        default=None,
        metadata=_option(
            "--min-agreement",
            "inference jobs: least share of rows whose top-1 class is the baseline's "
            f"(default {DEFAULT_MIN_AGREEMENT:g})",
            parse=float,
            metavar="A",
            form=FormInput(
                "least top-1 agreement",
                "of a classifier's rows, the share whose top-1 class is the baseline's",
                default=DEFAULT_MIN_AGREEMENT,
                min_value=0.0,
                max_value=1.0,
                step=0.005,
                format="%.3f",
            ),
        ),
    )
    draft_model: str | None = field(
        default=None,
        metadata=_option(
            "--draft-model",
            "generation jobs: a smaller model sharing the tokenizer (a from_pretrained "
            "folder); speculative decoding is tried with it, greedy tokens must stay the same",
            metavar="PATH",
        ),
    )
    goal: str = field(
        default="time",
        metadata=_option(
            "--goal",
            "time (default): keep the fastest candidate; memory: keep the candidate with "
            "the lowest peak memory among those within --max-slowdown",
            parse=parse_goal,
            metavar="{time,memory}",
        ),
    )
    max_slowdown: float | None = field(
        default=None,
        metadata=_option(
            "--max-slowdown",
            "with --goal memory: how much slower per sample a kept candidate may be, "
            f"1.5x or 50%% (default {DEFAULT_MAX_SLOWDOWN:g}x)",
            parse=parse_slowdown_arg,
            metavar="F",
        ),
    )
    # set from Python only (tests, benchmarks): no flag, not on the form
    tolerance: float = field(
        default=0.05, metadata=_option(help="the ratio within which a candidate is 'same'")
    )
    seed: int | None = field(default=0, metadata=_option(help="the arms' order's shuffle"))
    busy_repeats: int | None = field(
        default=None,
        metadata=_option(
            help="trials run again because other work competed, at most, per experiment "
            "(None: repeats.default_limit(); 0: none)"
        ),
    )

    # -- checks --------------------------------------------------------------------------
    def check(self) -> None:
        """ValueError in one line for options no experiment can run with, before any
        store, row or process exists."""
        from stepscope.optim_runner.guards.output_guard import check_limits  # heavy-ish

        check_size(self.steps, self.trials)
        if self.goal not in GOALS:
            raise ValueError(f"goal {self.goal!r}: one of {', '.join(GOALS)}")
        if self.max_slowdown is not None:
            if self.goal != "memory":
                raise ValueError("--max-slowdown is for --goal memory")
            if not self.max_slowdown >= 1:
                raise ValueError(f"max slowdown {self.max_slowdown!r}: a factor of 1 or more")
        check_budget(self.budget_min, self.full)
        check_limits(self.output_tolerance, self.min_agreement)

    # -- the CLI -------------------------------------------------------------------------
    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One argument per field with a flag; its ``dest`` is the field's name."""
        for f in dataclasses.fields(cls):
            meta = f.metadata
            if meta.get("flag") is None:
                continue
            kwargs: dict[str, Any] = {"dest": f.name, "help": meta["help"]}
            if f.type in ("bool", bool):  # a flag
                kwargs["action"] = "store_true"
            else:
                kwargs["default"] = f.default
                if meta["parse"] is not None:
                    kwargs["type"] = meta["parse"]
            if meta["metavar"] is not None:
                kwargs["metavar"] = meta["metavar"]
            parser.add_argument(meta["flag"], **kwargs)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ExperimentOptions:
        """The options of arguments parsed by a parser ``add_arguments`` filled."""
        return cls(**{f.name: getattr(args, f.name) for f in _flagged(cls)})

    # -- the background process's request --------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """Every field, JSON-ready (``fixes`` as a list)."""
        out = dataclasses.asdict(self)
        out["fixes"] = None if self.fixes is None else list(self.fixes)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExperimentOptions:
        """The options ``to_json`` wrote; a missing field takes its default. An unknown key
        is refused (ValueError): an option this stepscope would silently ignore is how
        the paths drifted apart before."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown experiment option(s): {', '.join(unknown)}")
        values = dict(data)
        if values.get("fixes") is not None:
            values["fixes"] = tuple(values["fixes"])
        return cls(**values)


def _flagged(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.metadata.get("flag") is not None]


def form_fields() -> tuple[str, ...]:
    """The options the dashboard's Optimize form sets (the others keep their defaults)."""
    return tuple(
        f.name for f in dataclasses.fields(ExperimentOptions) if f.metadata["form"] is not None
    )


def form_input(name: str) -> FormInput:
    """How the form shows option ``name``, its default and help filled in (KeyError: not
    an option of the form)."""
    for f in dataclasses.fields(ExperimentOptions):
        if f.name == name and f.metadata["form"] is not None:
            shown: FormInput = f.metadata["form"]
            return dataclasses.replace(
                shown,
                help=f.metadata["help"] if shown.help is None else shown.help,
                default=f.default if shown.default is None else shown.default,
            )
    raise KeyError(f"{name!r} is not an option of the Optimize form")


__all__ = [
    "DEFAULT_STEPS",
    "DEFAULT_TRIALS",
    "MIN_FORM_STEPS",
    "ExperimentOptions",
    "FormInput",
    "check_size",
    "form_fields",
    "form_input",
    "parse_fix_ids",
]
