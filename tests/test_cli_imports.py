"""The everyday commands answer at once: none imports a heavy module it does not use.

`stepscope --help`, `runs`, `tag` and `show` of an ended run (issue 41) load neither
pandas nor numpy, scipy, torch, SQLAlchemy (a SQLite store runs on sqlite3:
``store/sqlite_engine.py``), plotly nor Streamlit, nor the analyzers' rules: `show` reads
the run's diagnosis and the figures kept for it (``app/cli/show_kept.py``). `show` of a
run whose figures are not kept (running, changed, never shown), `check` and `diff`
compute figures with pandas (and scipy's intervals) but never load torch, SQLAlchemy or
the dashboard's modules. Checked by what a fresh interpreter holds in ``sys.modules``
once the command has run, never by a timing: these machines are noisy, and the figures
are in ``bench/cli_speed.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stepscope
from stepscope.analyzers.rules.diagnosis import diagnose_run
from stepscope.analyzers.steps.run_figures import listed_figures
from stepscope.app.cli.show_kept import keep_show_figures
from stepscope.store import RunStore
from stepscope.types import Finding

#: what the quick commands never load
HEAVY = {"pandas", "numpy", "scipy", "torch", "sqlalchemy", "plotly", "streamlit", "pyarrow"}
#: what no command that only reads the store loads
NEVER = {"torch", "sqlalchemy", "plotly", "streamlit"}
#: the analyzers' modules `show` of a run diagnosed, its figures kept, may load: the
#: saved diagnosis, the runs list's kept figures (``app/cli/runs.py``'s), and the
#: memory remedies' arithmetic on the kept breakdown (no rule, nothing imported)
SHOW_READS = {
    "stepscope.analyzers.rules",
    "stepscope.analyzers.rules.diagnosed",
    "stepscope.analyzers.rules.memory_state",
    "stepscope.analyzers.steps",
    "stepscope.analyzers.steps.run_figures",
}

# Runs the command in this interpreter, its output thrown away, then prints the name of
# every module it left loaded.
PROBE = """
import contextlib, io, json, sys
from stepscope.app.cli.main import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:  # --help
        code = exc.code
print(json.dumps({"code": code, "loaded": sorted(sys.modules)}))
"""


def top_level(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of three ended runs with steps, one tagged, whose runs-list figures are
    kept (as after any earlier `stepscope runs`): the first with a finding saved and no
    diagnosis marker (diagnosed again by `show`), the last diagnosed with its `show`
    figures kept (as `stepscope run` leaves a run)."""
    home = tmp_path_factory.mktemp("imports") / "home"
    finding = Finding.from_json(
        {"class": "io", "subtype": "input_pipeline", "title": "the job waits for data",
         "share": 0.4, "confidence": 0.9, "evidence": [{"text": "data wait 40 %"}],
         "fixes": [{"id": "dataloader_workers"}], "level": "steps"}
    )  # fmt: skip
    with RunStore(home) as store:
        for i in range(3):
            run_id = store.create_run(["python", "train.py"], name="train")
            store.add_steps(
                run_id,
                [{"step": s, "start_s": 100.0 + s, "end_s": 100.5 + s + 0.01 * i,
                  "data_wait_s": 0.1, "batch_size": 8} for s in range(12)],
            )  # fmt: skip
            store.add_samples(run_id, [(100.0 + k, "proc", "cpu_percent", 90.0) for k in range(5)])
            store.finish_run(run_id, "completed", 0)
            if i == 0:
                store.save_findings(run_id, [finding])
        store.set_tag("nightly", 1)
        listed_figures(store, store.run_list())
        diagnose_run(store, run_id, save=True)
    keep_show_figures(run_id, home)
    return home


def loaded(home: Path, *args: str) -> set[str]:
    """The modules a fresh `stepscope ARGS` left loaded (it must succeed), of the
    stepscope these tests import (first on its path, run outside the checkout)."""
    env = {k: v for k, v in os.environ.items() if k != "STEPSCOPE_STORE"}
    env["STEPSCOPE_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(stepscope.__file__).parents[1]), env.get("PYTHONPATH")) if p
    )
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True, text=True, timeout=120, env=env, check=False, cwd=home,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, (args, result["code"])
    return set(result["loaded"])


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("runs",),
        ("runs", "--json"),
        ("tag", "--list"),
        ("tag", "--list", "--json"),
        ("tag", "last", "newest"),
        ("show", "last"),
        ("show", "last", "--json"),
    ],
    ids=" ".join,
)
def test_the_quick_commands_load_nothing_heavy(home: Path, args: tuple[str, ...]) -> None:
    modules = loaded(home, *args)
    assert top_level(modules) & HEAVY == set()
    if args[0] == "show":  # the saved diagnosis is read, never made: no rules, no trace
        analyzers = {m for m in modules if m.startswith("stepscope.analyzers.")}
        assert analyzers <= SHOW_READS, analyzers - SHOW_READS


@pytest.mark.parametrize(
    "args",
    [
        ("show", "1"),  # its figures not kept, and its diagnosis made now
        ("check", "last", "--against", "nightly"),
        ("diff", "1", "last"),
    ],
    ids=" ".join,
)
def test_the_commands_that_compute_load_no_torch_nor_sqlalchemy(
    home: Path, args: tuple[str, ...]
) -> None:
    assert top_level(loaded(home, *args)) & NEVER == set()
