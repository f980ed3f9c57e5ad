"""A fix: everything stepscope knows about one optimisation, in one object.

Each fix module (``fixes/catalog/<id>.py``) declares one ``Fix``: what it addresses in the
taxonomy, what it requires of the job, whether it changes numerics, how to tell it is
already in effect, its predicted gain (``removes``, ``typical``), and the hooks the layers
above call instead of switching on its id:

* ``advise`` (analyzers, ``recommend``): refine the advice for one finding from the
  evidence (the thread count to try; only the syncs' own time can be won back);
* ``choose_params`` (optim_runner, ``plan``): its parameters for this run, with why;
* the in-job hooks (``install.py``): ``set_global``, ``on_loader``, ``on_model``,
  ``ddp_kwargs``/``after_ddp``, ``on_generate`` (every outer ``generate()`` call),
  ``patch``; or ``env`` for a fix the runner applies through the job's environment;
* ``took_effect`` (optim_runner, ``experiment``): did the trial's job show it?
* ``fit`` (analyzers, ``recommend``): its snippet and cited figure for this job's device
  and kind (a Tensor Core figure says nothing about a CPU, a training speed-up nothing
  about inference; ``fitting.py``);

``phases`` names the phases of the step a fix acts on, so that its predicted gain is
bounded by their share and not by a broader finding's.

Hooks receive the analyzers' evidence and the plan's context as plain objects (typed
``Any``, their attributes named in each hook's docstring): the fixes sit below both
layers and import neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepscope.fixes.points import Change, GenerateCall, LoaderCall, ModelCall
from stepscope.fixes.requirements import MUST_BE_SEEN, REQUIREMENTS
from stepscope.types import Finding, JobContext


@dataclass(frozen=True)
class Typical:
    """A speed-up range reported for this fix elsewhere, with where it comes from."""

    lo: float
    hi: float
    source: str


@dataclass(frozen=True)
class Fitting:
    """What a fix says to one job (``Fix.fit``): the snippet and the cited figure that fit
    its device and kind, since advice written for a GPU training loop misleads a CPU
    inference job. ``typical`` None with ``no_figure`` set: no cited figure was measured
    on a job like this one, and ``no_figure`` says so in place of a bound; ``title`` and
    ``why`` None keep the fix's own."""

    snippet: str
    typical: Typical | None
    no_figure: str | None = None
    title: str | None = None
    why: str | None = None


def _never(ctx: JobContext) -> bool | None:
    return None


@dataclass(frozen=True)
class Advice:
    """What ``Fix.advise`` makes of one finding: the share the fix can act on (None: the
    finding's), the fraction of it the fix removes there (None: the fix's ``removes``;
    a fix may remove more of one problem than of another), values to try, and the
    evidence for them."""

    share: float | None = None
    removes: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    evidence: str | None = None
    snippet: str | None = None


# The hooks' shapes (see the module docstring; the points are in ``points.py``).
AdviseHook = Callable[[Finding, Any], "Advice | str"]  # (finding, evidence) -> advice or why not
ParamsHook = Callable[[Any, "str | None"], tuple[dict[str, Any], str]]  # (plan ctx, finding)
GlobalHook = Callable[[Any, dict[str, Any]], Change]  # (torch, params)
LoaderHook = Callable[[LoaderCall, dict[str, Any]], None]
ModelHook = Callable[[ModelCall, dict[str, Any]], None]
DdpKwargsHook = Callable[[dict[str, Any]], dict[str, Any]]
AfterDdpHook = Callable[[Any, dict[str, Any]], Change]  # (the DDP module, params)
PatchHook = Callable[[Any, Any, dict[str, Any]], None]  # (installer, torch, params)
GenerateHook = Callable[[GenerateCall, dict[str, Any]], None]
FitHook = Callable[[JobContext], Fitting]  # the job's context -> its snippet and figure


@dataclass(frozen=True)
class Fix:
    """One optimisation. ``auto``: stepscope can apply it without a code change;
    otherwise it is advice with a snippet, never claimed as applied."""

    id: str
    title: str
    addresses: tuple[str, ...]  # 'class/subtype' keys of the taxonomy
    requires: tuple[str, ...]
    changes_numerics: bool
    auto: bool
    snippet: str
    why: str  # one sentence: how it removes the cost
    typical: Typical | None = None
    in_effect: Callable[[JobContext], bool | None] = _never
    removes: float = 1.0  # largest fraction of the finding's share it can remove
    # Compiles at its first steps (torch.compile): a trial's time limit allows for it.
    slow_start: bool = False
    # What it changes in the job, for "the job never created ..." when it did nothing.
    target: str = "what this fix changes"
    needs: str | None = None  # a fix it acts through (prefetching needs workers)
    # The problem it is really for: when the diagnosis has a finding for it, the fix is
    # advised there only, not again for the broader findings that also hold that time.
    primary: str | None = None
    env: tuple[str, str] | None = None  # (variable, option): applied by the runner
    # The step's phases it acts on ('optimizer', 'data_wait', 'forward', 'backward'):
    # where a finding spans other phases, the gain is bounded by these phases' share.
    phases: tuple[str, ...] = ()
    fit: FitHook | None = None
    advise: AdviseHook | None = None
    choose_params: ParamsHook | None = None
    set_global: GlobalHook | None = None
    on_loader: LoaderHook | None = None
    on_model: ModelHook | None = None
    ddp_kwargs: DdpKwargsHook | None = None
    after_ddp: AfterDdpHook | None = None
    on_generate: GenerateHook | None = None
    patch: PatchHook | None = None

    @property
    def needs_consent(self) -> bool:
        """Applied only when the user allows numerics to change (``--allow-numerics``, the
        Optimize page's toggle): every automatic fix that changes what the model computes
        (bf16, TF32, a larger batch). The quality guard checks the loss after the fact;
        consent is asked before, because a changed result is the user's call."""
        return self.auto and self.changes_numerics

    def fitting(self, ctx: JobContext) -> Fitting:
        """Its snippet and cited figure for this job (``fit``), else its own."""
        if self.fit is not None:
            return self.fit(ctx)
        return Fitting(self.snippet, self.typical)

    def requirement_status(self, ctx: JobContext) -> tuple[list[str], list[str]]:
        """(unmet, unknown) requirement names for this job."""
        unmet, unknown = [], []
        for name in self.requires:
            ok = REQUIREMENTS[name](ctx)
            if ok is False or (ok is None and name in MUST_BE_SEEN):
                unmet.append(name)
            elif ok is None:
                unknown.append(name)
        return unmet, unknown

    def params_for(self, ctx: Any, finding: str | None) -> tuple[dict[str, Any], str]:
        """(parameters for the plan file, why these values); none for most fixes."""
        return self.choose_params(ctx, finding) if self.choose_params else ({}, "")

    def took_effect(self, entries: list[dict[str, Any]]) -> str | None:
        """None when the trial's job shows the fix applied; else why not.

        ``entries``: the job's ``config["applied"]`` (``install.py``): one per change,
        with whether it was applied and whether the object read back showed it. A fix the
        runner applies through the environment is in effect by construction.
        """
        if self.env is not None:
            return None
        mine = [e for e in entries if e.get("fix") == self.id]
        if any(e.get("applied") and e.get("verified") is not False for e in mine):
            return None
        refused = [str(e.get("change", "")) for e in mine if not e.get("applied")]
        unverified = [str(e.get("change", "")) for e in mine if e.get("applied")]
        if refused:
            return "; ".join(r.removeprefix("not applied: ") for r in dict.fromkeys(refused))
        if unverified:
            return f"set ({unverified[0]}), but the job's object did not show it"
        return f"the job never created {self.target}"
