"""`stepscope show`'s figures, kept in the store once a run has ended (run_details).

Synthetic runs (steps, samples, a generation run's requests, a capture's memory
timeline from tests/data), on both backends. What `show` prints must be what computing
the figures gives, whether it computed them now or read them back; a run that changes
after its figures were kept has them computed again; a running run's are never kept;
a kept row that is not figures is never shown. What `show` imports is
``tests/test_cli_imports.py``'s; a real recorded run is ``tests/test_first_run.py``'s.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from stepscope.analyzers.rules.diagnosis import diagnose_run
from stepscope.app.cli import show_kept
from stepscope.app.cli.main import main
from stepscope.app.cli.show_figures import compute_figures
from stepscope.app.cli.show_kept import DETAILS_VERSION, keep_show_figures, run_state
from stepscope.store import RunStore, StoreError

TIMELINE = Path(__file__).resolve().parent / "data" / "memory_timeline.raw.gz"


def _steps(n: int, t0: float = 100.0) -> list[dict[str, Any]]:
    """``n`` steps of about 0.1 s, one long data wait, steps 4-5 profiled."""
    rows, t = [], t0
    for s in range(n):
        took = 0.1 + 0.01 * (s % 3) + (0.3 if s == 7 else 0.0)
        rows.append(
            {"step": s, "start_s": t, "end_s": t + took, "data_wait_s": 0.3 if s == 7 else 0.01,
             "batch_size": 32, "loss": 2.0 / (s + 1), "kind": "optimizer",
             "profiled": s in (4, 5), "forward_s": 0.03, "backward_s": 0.04,
             "optimizer_s": 0.01}
        )  # fmt: skip
        t += took
    return rows


def _requests(n: int) -> list[dict[str, Any]]:
    """``n`` finished generate() requests, one a step."""
    return [
        {"request": i, "step": i, "source": "generate", "status": "done",
         "start_s": 100.0 + i, "end_s": 100.5 + i + 0.01 * i, "rows": 1,
         "prompt_tokens": 12, "new_tokens": 20, "ttft_s": 0.05, "prefill_s": 0.04,
         "decode_s": 0.4, "forwards": 21}
        for i in range(n)
    ]  # fmt: skip


def make_run(
    store: RunStore, *, status: str = "completed", timeline: bool = True, requests: int = 0
) -> int:
    """A run with 12 steps, 10 samples, a capture's memory timeline, diagnosed."""
    run_id = store.create_run(["python", "train.py"], name="kept")
    store.add_steps(run_id, _steps(12))
    store.add_samples(
        run_id,
        [(100.0 + k * 0.2, "proc", "cpu_percent", 50.0 + k) for k in range(10)]
        + [(100.0 + k * 0.2, "system", "cpu_percent", None) for k in range(3)],
    )
    if requests:
        store.add_requests(run_id, _requests(requests))
    if timeline:
        folder = store.run_dir(run_id)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "host_1.1.memory_timeline.raw.json.gz"
        shutil.copy(TIMELINE, path)
        store.add_artifact(run_id, "memory_timeline", path, meta={"device": "cuda:0"})
    if status != "running":
        store.finish_run(run_id, status, 0)
        diagnose_run(store, run_id, save=True)  # as `stepscope run` does: `show` reads it
    return run_id


@pytest.fixture
def home(tmp_path: Path, store_backend: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STEPSCOPE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def show(capsys: pytest.CaptureFixture[str], run_id: int) -> tuple[dict[str, Any], str]:
    """`show RUN --json` and `show RUN`, as printed."""
    assert main(["show", str(run_id), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert main(["show", str(run_id)]) == 0
    return data, capsys.readouterr().out


def kept(store: RunStore, run_id: int) -> dict[str, Any] | None:
    """The figures kept for the run, if they hold for it as it is now."""
    row = store.kept_details(run_id)
    if row is None or row[:2] != (run_state(store, store.run(run_id)), DETAILS_VERSION):
        return None
    return row[2]


def test_show_prints_the_same_computed_and_kept(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first `show` computes the figures and keeps them, the next reads them back:
    both print the same, to the last digit, and that is what computing them gives."""
    with RunStore(home) as store:
        ids = [make_run(store), make_run(store, requests=6, timeline=False)]
    for run_id in ids:
        with RunStore(home) as store:
            assert store.kept_details(run_id) is None
        first = show(capsys, run_id)
        with RunStore(home) as store:
            figures = kept(store, run_id)
            assert figures == compute_figures(store, run_id)
        assert show(capsys, run_id) == first
        data, text = first
        assert data["steps"] == 12 and data["timed_steps"] > 0
        assert data["samples"]["metrics"]["proc.cpu_percent"]["max"] == 59.0
        assert "median step time" in text and "job CPU %" in text
    (training, _), (generation, gen_text) = show(capsys, ids[0]), show(capsys, ids[1])
    assert training["memory"]["peak_bytes"] > 0 and training["memory"]["lines"][0].startswith(
        "peak "
    )
    assert "memory (stepscope memory" in show(capsys, ids[0])[1]
    assert training["generation"] is None and training["latency"] is None
    assert generation["generation"]["requests"] == 6 and generation["latency"] is None
    timed = generation["generation"]["timed_requests"]
    assert generation["memory"] is None and f"per request ({timed} timed)" in gen_text


def test_show_reads_what_was_kept(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A kept row whose run is as it was is read, not computed again: a figure changed in
    the store shows; kept by another DETAILS_VERSION, it is computed again."""
    with RunStore(home) as store:
        run_id = make_run(store)
    computed = show(capsys, run_id)[0]
    with RunStore(home) as store:
        state, version, figures = store.kept_details(run_id)
        figures["steps"]["step_time_median_s"] = 7.0
        store.keep_details(run_id, state, version, figures)
    data, text = show(capsys, run_id)
    assert data["step_time_median_s"] == 7.0 and "7.00 s" in text
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(show_kept, "DETAILS_VERSION", DETAILS_VERSION + 1)
        assert show(capsys, run_id)[0] == computed
        with RunStore(home) as store:
            assert store.kept_details(run_id)[1] == DETAILS_VERSION + 1


def test_a_run_that_changes_after_its_figures_were_kept_gets_new_ones(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A step, a sample, a request or an artifact added after the figures were kept, or
    the run ended again: each time they are computed again, over what the run has then."""
    with RunStore(home) as store:
        run_id = make_run(store)
    before = show(capsys, run_id)[0]
    changes = [
        lambda s: s.add_steps(run_id, [{**_steps(13)[-1]}]),
        lambda s: s.add_samples(run_id, [(200.0, "proc", "cpu_percent", 99.0)]),
        lambda s: s.add_requests(run_id, _requests(2)),
        lambda s: s.add_artifact(run_id, "trace", s.run_dir(run_id) / "late.pt.trace.json.gz"),
        lambda s: s.finish_run(run_id, "failed", 1),
    ]
    for change in changes:
        with RunStore(home) as store:
            change(store)
            assert kept(store, run_id) is None  # no longer holds
        data = show(capsys, run_id)[0]
        with RunStore(home) as store:
            assert kept(store, run_id) == compute_figures(store, run_id)
        assert data != before
        before = data
    assert (data["steps"], data["status"]) == (13, "failed")
    assert data["samples"]["metrics"]["proc.cpu_percent"]["max"] == 99.0
    assert data["generation"]["requests"] == 2


def test_a_running_run_is_computed_at_every_show(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with RunStore(home) as store:
        run_id = make_run(store, status="running")
    data = show(capsys, run_id)[0]
    assert data["status"] == "running" and data["steps"] == 12
    with RunStore(home) as store:
        assert store.kept_details(run_id) is None
        store.add_steps(run_id, [{**_steps(13)[-1]}])
    assert show(capsys, run_id)[0]["steps"] == 13


def test_kept_rows_that_are_not_figures_are_computed_again(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shared store is anyone's to write: a kept row that is not the figures' shape is
    never shown, and the figures computed in its place replace it."""
    with RunStore(home) as store:
        run_id = make_run(store)
    expected = show(capsys, run_id)[0]
    with RunStore(home) as store:
        state = store.kept_details(run_id)[0]
    for text in (
        "not json",
        json.dumps([1.0, 2.0]),
        json.dumps({"steps": {}, "samples": {}}),
        json.dumps({"steps": "$(rm -rf ~)", "generation": None, "samples": {}, "memory": None}),
    ):
        with RunStore(home) as store:
            store._db.execute(
                "UPDATE run_details SET details=:d, state=:s, version=:v WHERE run_id=:id",
                {"d": text, "s": state, "v": DETAILS_VERSION, "id": run_id},
            )
        assert show(capsys, run_id)[0] == expected, text
        with RunStore(home) as store:
            assert kept(store, run_id) == compute_figures(store, run_id)


def test_what_is_not_kept(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memory breakdown whose file cannot be read is shown with its problem and not
    kept (the file may come back); a store that refuses the row is shown all the same."""
    with RunStore(home) as store:
        run_id = make_run(store, timeline=False)
        store.add_artifact(
            run_id, "memory_timeline", store.run_dir(run_id) / "gone.memory_timeline.raw.json.gz"
        )
        store.finish_run(run_id, "completed", 0)
    data = show(capsys, run_id)[0]
    assert data["memory"]["problems"] and data["memory"]["peak_bytes"] is None
    with RunStore(home) as store:
        assert store.kept_details(run_id) is None
        other = make_run(store)

    def refuse(*args: object, **kwargs: object) -> None:
        raise StoreError("read-only")

    monkeypatch.setattr(RunStore, "keep_details", refuse)
    assert show(capsys, other)[0]["steps"] == 12
    with RunStore(home) as store:
        assert store.kept_details(other) is None


def test_the_run_verb_keeps_the_figures_once_the_verdict_is_printed(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stepscope run` keeps `show`'s figures as the run ends, after its verdict, so the
    first `show` of a run reads them; `--quiet` (no verdict, no diagnosis) does not."""
    from stepscope.collectors.launch import launcher

    said: list[str] = []
    monkeypatch.setattr(
        "stepscope.app.cli.verdict.print_verdict", lambda run_id: said.append("verdict")
    )
    real_keep = show_kept.keep_show_figures

    def keep(run_id: int) -> None:
        said.append("keep")
        real_keep(run_id)

    monkeypatch.setattr(show_kept, "keep_show_figures", keep)
    with RunStore(home) as store:
        ids = [make_run(store), make_run(store)]
    recorded = iter(ids)
    monkeypatch.setattr(launcher, "launch", lambda *a, **k: (next(recorded), 0))
    verb = ["run", "--", "python", "train.py"]
    assert main(verb) == 0
    assert said == ["verdict", "keep"]
    assert main([*verb[:1], "--quiet", *verb[1:]]) == 0
    assert said == ["verdict", "keep"]
    with RunStore(home) as store:
        assert kept(store, ids[0]) == compute_figures(store, ids[0])
        assert store.kept_details(ids[1]) is None
    keep_show_figures(ids[1])  # never raises, and keeps
    keep_show_figures(999)  # an unknown run: nothing to keep, nothing raised
    with RunStore(home) as store:
        assert kept(store, ids[1]) is not None


def test_details_version_pins_how_the_figures_are_computed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept figures are those of the DETAILS_VERSION they were computed by: a change to
    how compute_figures (summarize_steps, generation_summary, samples_summary, the memory
    breakdown) computes a figure must raise it (every kept row is then computed again),
    or `show` prints the old figures. This pins both together: when it fails, raise
    show_kept.DETAILS_VERSION and write the new digest here."""
    monkeypatch.delenv("STEPSCOPE_STORE", raising=False)
    with RunStore(tmp_path / "home") as store:
        run_id = make_run(store, status="running", requests=4)
        figures = compute_figures(store, run_id)
    digest = hashlib.sha256(json.dumps(figures, sort_keys=True).encode()).hexdigest()
    assert (DETAILS_VERSION, digest[:16]) == (1, "fcdf276530b06e8f")
