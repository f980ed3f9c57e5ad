"""The catalog's contract: one module per fix, each complete for what it claims.

The in-job behaviour of each hook is tested on real jobs in test_apply.py and
test_apply_frameworks.py; the advice in test_diagnosis.py; the parameters in test_plan.py.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from stepscope import fixes as catalog
from stepscope.fixes.base import Fix
from stepscope.fixes.requirements import REQUIREMENTS
from stepscope.types import BottleneckClass

IN_JOB_HOOKS = (
    "set_global",
    "on_loader",
    "on_model",
    "ddp_kwargs",
    "after_ddp",
    "on_generate",
    "patch",
)


def _applied_by(fix: Fix) -> list[str]:
    return [hook for hook in IN_JOB_HOOKS if getattr(fix, hook) is not None]


@pytest.mark.parametrize("module", catalog.MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_each_module_is_one_fix_named_after_it(module) -> None:
    assert isinstance(module.FIX, Fix)
    assert Path(inspect.getfile(module)).stem == module.FIX.id
    fixes_here = [v for v in vars(module).values() if isinstance(v, Fix)]
    assert fixes_here == [module.FIX]


def test_every_module_in_the_package_is_in_the_catalog() -> None:
    folder = Path(catalog.__file__).parent / "catalog"
    files = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    assert files == set(catalog.FIXES)
    assert len(catalog.MODULES) == len(catalog.FIXES)  # no id twice


@pytest.mark.parametrize("fix", catalog.FIXES.values(), ids=lambda f: f.id)
def test_a_fix_declares_what_it_addresses_and_needs(fix: Fix) -> None:
    for key in fix.addresses:
        klass, subtype = key.split("/")
        BottleneckClass(klass)
        assert subtype
    assert set(fix.requires) <= set(REQUIREMENTS)
    assert fix.needs is None or fix.needs in catalog.FIXES
    assert fix.title and fix.why and fix.snippet


@pytest.mark.parametrize("fix", catalog.FIXES.values(), ids=lambda f: f.id)
def test_automatic_fixes_are_applied_one_way_and_advice_never(fix: Fix) -> None:
    """An auto fix has exactly one way into the job (hooks of one point, or the
    environment); advice (a code change) has none: it is never claimed as applied."""
    hooks = _applied_by(fix)
    if not fix.auto:
        assert hooks == [] and fix.env is None and fix.choose_params is None
        return
    assert bool(hooks) != (fix.env is not None), hooks
    if set(hooks) - {"set_global"}:  # acts on an object the job may never create
        assert fix.target != Fix.target, "say what it changes, for 'the job never created ...'"


def test_took_effect_reads_the_jobs_own_report() -> None:
    workers = catalog.get("dataloader_workers")
    assert workers.took_effect([]) == (
        "the job never created a DataLoader (the job feeds its model without one)"
    )
    kept = {
        "fix": "dataloader_workers",
        "change": "not applied: kept the job's num_workers=0 (set explicitly; --keep-explicit)",
        "applied": False,
    }
    assert workers.took_effect([kept]) == (
        "kept the job's num_workers=0 (set explicitly; --keep-explicit)"
    )
    unread = {"fix": "dataloader_workers", "change": "num_workers 0 -> 4", "applied": True}
    assert workers.took_effect([dict(unread, verified=False)]).startswith("set (num_workers")
    assert workers.took_effect([dict(unread, verified=True)]) is None
    assert catalog.get("expandable_segments").took_effect([]) is None  # the runner sets it


def test_slow_start_is_the_compilers() -> None:
    slow = [f.id for f in catalog.FIXES.values() if f.slow_start]
    assert slow == ["static_cache_compile", "torch_compile"]
