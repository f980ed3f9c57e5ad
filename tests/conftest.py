"""Shared test set-up: every test gets its own run store, never the user's ~/.stepscope.

The suite runs in parallel (pytest-xdist, one test file per worker at a time; see
pyproject.toml): the files that take longest are handed out first, so that no worker
is left with a long file at the end while the other idles.
"""

from __future__ import annotations

import inspect
import os
import re
import signal
import tempfile
import types
from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit import config as st_config

# A suite started in the background by a non-interactive shell (`bash .ci/run &`) inherits
# SIGINT ignored, and so does every job and dashboard it starts: the tests that stop them
# with Ctrl-C, as a user does, then wait for nothing (every Chromium test failed so, and a
# job given SIGINT ran on). A handler, unlike "ignored", is not inherited across exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The suite runs two workers on two cores, each starting real torch jobs beside the
# other's: OpenMP threads that spin while they wait for a core (libgomp's default) burn
# a fifth of the suite's CPU for nothing there. Waiting threads sleep instead, in every
# job the tests start (they inherit the environment); thread counts are unchanged.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# For the same reason every trial of a test's experiment has the other worker's job
# beside it: busy trials are not run again here (optim_runner/trials/repeats.py), which would
# add up to six trials to every experiment of the suite; tests of repeats turn them on.
os.environ.setdefault("STEPSCOPE_BUSY_REPEATS", "0")

# Runs are signed with the user's key (store/user_key.py): the suite's runs, its jobs and
# its CLI calls (they inherit the environment) share one key of their own, in a private
# folder of the temporary directory, never the user's ~/.config/stepscope/key.
os.environ.setdefault(
    "STEPSCOPE_KEY", str(Path(tempfile.gettempdir()) / f"stepscope-tests-{os.getuid()}" / "key")
)

# The pages that AppTest runs in this process see the bind address `stepscope dashboard`
# gives Streamlit by default, the loopback (app/dashboard/access.py reads it); a test of a
# dashboard that others can reach sets its own.
st_config.set_option("server.address", "127.0.0.1")

# Scripts run on a real GPU by hand (see tests/gpu/README.md), not collected by pytest.
collect_ignore = ["gpu", "jobs"]
# The S3 endpoint fixtures (moto's server) for the tests of artifacts in object storage;
# a real PostgreSQL server (pg_url, store_backend: a test on both store backends).
pytest_plugins = ["s3_server", "pg_server"]

# The files with the longest total time (`pytest --durations=0` on 2 cores), longest
# first; every other file follows in the usual order. Only the order depends on this.
LONGEST_FIRST = (
    "test_writer_load.py",
    "test_experiment.py",
    "test_app_pages.py",
    "test_generation_optimize.py",
    "test_demo.py",
    "test_attach.py",
    "test_dashboard_e2e.py",
    "test_trust.py",
    "test_examples.py",
    "test_step_timer.py",
    "test_corpus.py",
    "test_apply.py",
    "test_generation_fixes.py",
    "test_generation_collect.py",
    "test_multinode.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: keeps the rest
    for item in items:
        if starts_jobs_or_servers(item):
            item.add_marker(pytest.mark.slow)


# -- the quick tier: `pytest -m "not slow"` ------------------------------------------------
# A test is slow when it starts a real job (a training or trial process, a CLI subprocess)
# or a server (PostgreSQL, moto's S3, Ray, the dashboard, a browser). Rather than a marker
# on every such test, which the next test would forget, a test is marked here when its
# own code, a fixture it uses or a helper of tests/ it calls (followed through calls)
# names one of the things that start them; files may still mark tests by hand.
STARTS_JOB_OR_SERVER = re.compile(
    r"\bsubprocess\.(?:run|Popen|call|check_call|check_output)\b|\bPopen\(|\bpty\.fork"
    r"|\b(?:launch_run|launch_trial|run_experiment|start_experiment|start_attach|run_sampler"
    r"|calibrate|ThreadedMotoServer|AppTest|sync_playwright|multiprocessing)\b"
    r"|\b(?:main|cli\.main)\(\s*\[\s*[\"'](?:run|optimize|demo|attach|calibrate|dashboard)[\"']"
)
TESTS = Path(__file__).resolve().parent
_verdicts: dict[object, bool] = {}


def starts_jobs_or_servers(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("store_backend") == "postgresql":
        return True  # store_backend asks for the PostgreSQL server only for this parameter
    funcs: list[Callable] = [getattr(item, "function", None)]
    for name in getattr(item, "fixturenames", ()):
        funcs += [d.func for d in item._fixtureinfo.name2fixturedefs.get(name, ())]
    return any(_starts(func) for func in funcs if func is not None)


def _starts(func: object, depth: int = 0) -> bool:
    func = inspect.unwrap(func)  # type: ignore[arg-type]
    if not inspect.isfunction(func) or not _in_tests(func) or depth > 6:
        return False
    if func in _verdicts:
        return _verdicts[func]
    _verdicts[func] = False  # recursion guard
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        source = ""
    found = bool(STARTS_JOB_OR_SERVER.search(source)) or any(
        _starts(callee, depth + 1) for callee in _callees(func)
    )
    _verdicts[func] = found
    return found


def _callees(func: types.FunctionType) -> list[object]:
    """What of tests/ ``func`` names: functions, classes, attributes of helper modules."""
    names: set[str] = set()
    codes = [func.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    out: list[object] = []
    for name in names:
        value = func.__globals__.get(name)
        if inspect.ismodule(value) and _in_tests(value):
            out += [getattr(value, attr) for attr in names if hasattr(value, attr)]
        elif inspect.isclass(value) and _in_tests(value):
            out += list(vars(value).values())  # a helper class's methods (a server's start)
        elif value is not None:
            out.append(value)
    return out


def _in_tests(obj: object) -> bool:
    try:
        path = inspect.getsourcefile(obj)  # type: ignore[arg-type]
    except TypeError:
        return False
    return path is not None and Path(path).resolve().is_relative_to(TESTS)


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "stepscope-home"
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    monkeypatch.delenv("STEPSCOPE_STORE", raising=False)  # tests opt in: store_backend
    return home
