"""stepscope's imports keep to its layers (tests/import_layers.py), and the check bites."""

from __future__ import annotations

from pathlib import Path

import stepscope
from tests.import_layers import imports, layer_of, violations

ROOT = Path(stepscope.__file__).parent


def test_no_import_goes_up_a_layer_and_local_imports_say_why() -> None:
    assert violations(ROOT) == []


def test_the_layers_are_the_documented_order() -> None:
    order = [
        "stepscope.types",
        "stepscope.store.store",
        "stepscope.fixes.install",
        "stepscope.collectors.injob.bootstrap",
        "stepscope.analyzers.trace.load",
        "stepscope.analyzers.hardware.roofline",
        "stepscope.analyzers.report.trace_report",
        "stepscope.analyzers.rules.diagnosis",
        "stepscope.optim_runner.trials.plan",
        "stepscope.app",
        "stepscope",
    ]
    assert [layer_of(m) for m in order] == sorted(layer_of(m) for m in order)
    assert len({layer_of(m) for m in order}) == len(order)


def test_a_deliberate_cycle_is_caught(tmp_path: Path) -> None:
    """analyzers -> optim_runner -> analyzers: the upward half is reported, local or not."""
    root = tmp_path / "stepscope"
    for package in ("analyzers", "optim_runner"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "optim_runner" / "plan.py").write_text("from stepscope.analyzers import rules\n")
    (root / "analyzers" / "rules.py").write_text(
        "def pick():\n    from stepscope.optim_runner.plan import choose\n    return choose\n"
    )
    found = violations(root)
    assert found == [
        "stepscope.analyzers.rules:2 imports stepscope.optim_runner.plan, a layer above it "
        "(stepscope.optim_runner over stepscope.analyzers.rules)",
        "stepscope.analyzers.rules:2 imports stepscope.optim_runner.plan inside a function, "
        "no reason given",
    ]
    # the same import at the top of the module is still the upward half of a cycle
    (root / "analyzers" / "rules.py").write_text("from .. import optim_runner\n")
    assert [i.target for i in imports(root) if i.module == "stepscope.analyzers.rules"] == [
        "stepscope.optim_runner"
    ]
    assert len(violations(root)) == 1
