"""Artifacts in object storage: real jobs upload their traces to a real S3 endpoint
(moto's server, tests/s3_server.py), and the CLI and the dashboard analyse them from there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from dashboard_helpers import ENTRY, REPO
from s3_server import (
    ACCESS_KEY_ID,
    S3,
    SECRET_ACCESS_KEY,
    aws_env,
    free_port,
    make_bucket,
)
from streamlit.testing.v1 import AppTest

from stepscope import api
from stepscope.analyzers.report.trace_report import analyze_trace
from stepscope.store import RunStore
from stepscope.store.artifacts import (
    ARTIFACTS_ENV,
    ArtifactError,
    BackgroundUploads,
    Location,
    artifact_location,
    cache_path,
    local_copy,
    upload,
    upload_run_file,
)

_spec = importlib.util.spec_from_file_location(
    "stepscope_test_jobs_util", Path(__file__).parent / "jobs" / "util.py"
)
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)

PREFIX = "team/exp1"


def stepscope(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The `stepscope` CLI in a process of its own, with this test's environment."""
    return subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), *args],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=240,
    )


def store_text(home: Path) -> str:
    """Every row of every table of the store, as text: what a secret would be found in."""
    with sqlite3.connect(home / "stepscope.db") as conn:
        return "\n".join(conn.iterdump())


@pytest.fixture(scope="module")
def uploaded(s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`stepscope --artifacts s3://... run --profile-at 2 -- python tests/jobs/train.py`."""
    home = tmp_path_factory.mktemp("s3run") / "home"
    with pytest.MonkeyPatch.context() as mp:
        aws_env(mp, s3_endpoint)
        bucket = make_bucket(s3_endpoint)
        proc = stepscope(
            home,
            "--artifacts",
            f"s3://{bucket.bucket}/{PREFIX}/",
            "run",
            "--name",
            "up",
            "--profile-at",
            "2",
            "--profile-steps",
            "2",
            "--",
            sys.executable,
            "tests/jobs/train.py",
            "--steps",
            "6",
        )
    with RunStore(home) as store:
        run_id = store.resolve_run("up")
        arts = store.artifacts(run_id)
        events = store.events(run_id)
    return {
        "home": home,
        "bucket": bucket,
        "proc": proc,
        "id": run_id,
        "arts": arts,
        "events": events,
    }


@pytest.mark.slow  # a real job under stepscope
def test_run_uploads_its_trace_and_stores_no_secret(uploaded: dict) -> None:
    proc, run_id, bucket = uploaded["proc"], uploaded["id"], uploaded["bucket"]
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout
    arts, log = uploaded["arts"], list(uploaded["events"]["message"])
    kinds = timeline_or_its_line(list(arts["kind"]), log)  # the capture's files
    assert sorted(arts["kind"]) == sorted(kinds), log
    arts = arts[arts["kind"] == "trace"].reset_index(drop=True)
    uri = arts["path"][0]
    name = Path(arts["meta"][0]["local_path"]).name
    assert uri == f"s3://{bucket.bucket}/{PREFIX}/runs/{run_id}/{name}"
    assert name.endswith(".pt.trace.json.gz")
    key = f"{PREFIX}/runs/{run_id}/{name}"
    timeline = key.replace(".pt.trace.json.gz", ".memory_timeline.raw.json.gz")
    assert sorted(bucket.keys()) == sorted([key, timeline][: len(kinds)])
    local = Path(arts["meta"][0]["local_path"])
    assert bucket.read(key) == local.read_bytes()  # the local file stays: it is the cache
    assert arts["meta"][0]["first_step"] == 2 and arts["meta"][0]["steps"] == 2
    head = bucket.client.head_object(Bucket=bucket.bucket, Key=key)
    assert head["Metadata"] == {"run-id": str(run_id), "rank": "0", "kind": "trace"}
    assert not (uploaded["events"]["source"] == "artifacts").any()  # no upload warning

    everything = store_text(uploaded["home"]) + proc.stdout + proc.stderr
    assert SECRET_ACCESS_KEY not in everything
    assert ACCESS_KEY_ID not in everything
    with RunStore(uploaded["home"]) as store:
        env = store.run(run_id)["env"]
    assert not [k for k in env["vars"] if k.startswith("AWS_")]


@pytest.mark.slow  # a real job under stepscope
def test_analyze_reads_the_trace_from_s3(
    uploaded: dict, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local file gone: `stepscope analyze RUN` downloads the trace into the cache once,
    and reads the cache afterwards (here with the endpoint unreachable). The reader is set
    up as the team's: the same artifact location, whose objects alone it reads."""
    aws_env(monkeypatch, s3_endpoint)
    monkeypatch.setenv("STEPSCOPE_ARTIFACTS", f"s3://{uploaded['bucket'].bucket}/{PREFIX}")
    home, run_id = uploaded["home"], uploaded["id"]
    uri = uploaded["arts"]["path"][0]
    Path(uploaded["arts"]["meta"][0]["local_path"]).unlink(missing_ok=True)
    cached = cache_path(uri, home)
    cached.unlink(missing_ok=True)

    report = api.analyze(run_id, home=home)  # the notebook API: the same path
    assert report.paths == [str(cached)] and report.trace_report.summary["steps"] == 2
    cached.unlink()

    proc = stepscope(home, "analyze", str(run_id), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["run_id"] == run_id and data["steps"] == 2
    assert data["paths"] == [str(cached)]
    assert cached.is_file() and cached.read_bytes() == uploaded["bucket"].read(uri.split("/", 3)[3])
    assert not list(cached.parent.glob("*.part"))  # the download was renamed into place

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
    again = stepscope(home, "analyze", str(run_id), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["steps"] == 2


@pytest.mark.slow  # a real job under stepscope
def test_dashboard_run_page_opens_the_s3_trace(
    uploaded: dict, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    aws_env(monkeypatch, s3_endpoint)
    monkeypatch.setenv("STEPSCOPE_ARTIFACTS", f"s3://{uploaded['bucket'].bucket}/{PREFIX}")
    home, run_id = uploaded["home"], uploaded["id"]
    uri = uploaded["arts"]["path"][0]
    Path(uploaded["arts"]["meta"][0]["local_path"]).unlink(missing_ok=True)
    cache_path(uri, home).unlink(missing_ok=True)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))

    at = AppTest.from_file(str(ENTRY), default_timeout=120)
    at.run()
    at.query_params.update(run=str(run_id))
    at.switch_page("views/run/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert not [w.value for w in at.warning if "no longer" in w.value]
    report = analyze_trace([cache_path(uri, home)])
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    breakdown = next(sp for sp in specs if "DataLoader" in [t.get("name") for t in sp["data"]])
    assert len(breakdown["data"][0]["x"]) == len(report.per_step) == 2
    downloads = [b.label for b in at.get("download_button")]
    assert any(Path(uri).name in label for label in downloads)


@pytest.mark.slow  # a real job under stepscope
def test_unreachable_endpoint_keeps_the_job_and_the_local_trace(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
    run_id, proc = jobs.run_job(
        tmp_path,
        "train.py",
        "--steps",
        "5",
        profile_at=1,
        profile_steps=2,
        extra_env={ARTIFACTS_ENV: f"s3://{s3.bucket}/p"},
    )
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr
    assert "Traceback" not in proc.stderr and "stepscope" not in proc.stderr
    arts = jobs.artifacts(tmp_path, run_id)
    log = list(jobs.events(tmp_path, run_id)["message"])
    kinds = timeline_or_its_line(list(arts["kind"]), log)
    assert sorted(arts["kind"]) == sorted(kinds), log
    assert all(Path(p).is_file() for p in arts["path"])  # each kept in the run folder
    lines = [m for m in log if "s3://" in m]
    assert len(lines) == len(kinds) and all("\n" not in line for line in lines)  # one per file
    lines = [line for line in lines if line.startswith("trace ")]
    assert len(lines) == 1
    assert f"s3://{s3.bucket}/p/runs/{run_id}/" in lines[0]
    assert "endpoint unreachable" in lines[0]
    assert s3.keys() == []


def timeline_or_its_line(kinds: list[str], log: list[str]) -> list[str]:
    """The artifacts a capture must leave: its trace, then its memory timeline, or, where
    torch's timeline export failed (it did twice in full CI runs on a loaded machine), the
    one warning line the capture promises instead (profiler_capture.py); never a row lost."""
    if "memory_timeline" in kinds or not any(
        m.startswith("memory timeline not saved") for m in log
    ):
        return ["trace", "memory_timeline"]
    return ["trace"]


def test_the_exit_wait_returns_after_every_row_is_written(tmp_path: Path) -> None:
    """The job closes its writer once ``wait`` returns: a ``done`` still writing its row
    then would lose it (a CI run lost a memory timeline's row so)."""
    uploads = BackgroundUploads(Location(str(tmp_path / "shared")))
    written: list[str] = []
    started = threading.Event()

    def slow_row(uri: str | None, error: str | None) -> None:
        started.set()
        time.sleep(1.0)  # the store is busy
        written.append(uri or error or "")

    path = tmp_path / "a.pt.trace.json.gz"
    path.write_bytes(b"x")
    uploads.submit(str(path), 1, 0, "trace", slow_row)
    assert started.wait(30)
    uploads.wait(timeout=0.1)  # the deadline passes while the row is being written
    assert len(written) == 1 and written[0].endswith("a.pt.trace.json.gz")


@pytest.mark.slow  # a real job under stepscope
def test_missing_bucket_is_one_line_in_the_run_log(s3: S3, tmp_path: Path) -> None:
    run_id, proc = jobs.run_job(
        tmp_path,
        "train.py",
        "--steps",
        "4",
        profile_at=1,
        profile_steps=1,
        extra_env={ARTIFACTS_ENV: "s3://no-such-bucket-stepscope/p"},
    )
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr
    arts = jobs.artifacts(tmp_path, run_id)
    assert Path(arts["path"][0]).is_file()
    events = jobs.events(tmp_path, run_id)
    lines = list(events.loc[events["source"] == "artifacts", "message"])
    # one line per file the capture wrote (the trace, its memory timeline), each naming
    # the bucket; the files stay in the run folder
    assert len(lines) == len(arts) and {k for k in arts["kind"]} >= {"trace"}
    assert all("no-such-bucket-stepscope" in ln and "bucket missing" in ln for ln in lines)


def test_local_copy_errors_name_the_uri_and_leave_no_file(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEPSCOPE_ARTIFACTS", f"s3://{s3.bucket}")
    uri = f"s3://{s3.bucket}/runs/1/gone.pt.trace.json.gz"
    with pytest.raises(ArtifactError, match=f"^{uri}: object missing$"):
        local_copy(uri, tmp_path, run_id=1)
    assert not cache_path(uri, tmp_path).exists()
    assert not list(cache_path(uri, tmp_path).parent.glob("*"))  # no half file either


def test_an_object_over_the_cap_is_not_even_fetched(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain JSON object of 2 MiB with a cap of 1 MiB: refused by its size in the
    bucket's listing, before a byte of it reaches the cache."""
    monkeypatch.setenv("STEPSCOPE_ARTIFACTS", f"s3://{s3.bucket}")
    monkeypatch.setenv("STEPSCOPE_MAX_TRACE_BYTES", "1M")
    key = "runs/1/huge.pt.trace.json"
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=b" " * (2 << 20))
    uri = f"s3://{s3.bucket}/{key}"
    with pytest.raises(ArtifactError, match=f"^{uri}: too large: 2.0 MiB of JSON, over the cap"):
        local_copy(uri, tmp_path, run_id=1)
    assert not cache_path(uri, tmp_path).exists()


def test_no_credentials_is_said(s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    f = tmp_path / "a.txt"
    f.write_text("x")
    with pytest.raises(ArtifactError, match="no credentials"):
        upload(f, 3, location=artifact_location(f"s3://{s3.bucket}"))


def test_trial_log_upload_and_folder_location(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial's output.log goes where the artifacts go, recorded with its URI."""
    monkeypatch.setenv(ARTIFACTS_ENV, f"s3://{s3.bucket}/logs")
    with RunStore(tmp_path / "home") as store:
        run_id = store.create_run(["python", "x.py"])
        (store.run_dir(run_id) / "output.log").write_text("step 1\n")
        upload_run_file(store, run_id, "output.log", "log")
        arts = store.artifacts(run_id)
    assert list(arts["path"]) == [f"s3://{s3.bucket}/logs/runs/{run_id}/output.log"]
    assert s3.read(f"logs/runs/{run_id}/output.log") == b"step 1\n"

    shared = tmp_path / "shared"
    uri = upload(
        tmp_path / "home" / "runs" / str(run_id) / "output.log",
        run_id,
        location=artifact_location(str(shared)),
    )
    assert Path(uri) == shared / "runs" / str(run_id) / "output.log"
    assert Path(uri).read_text() == "step 1\n"


@pytest.mark.parametrize(
    "url, problem",
    [
        ("gs://bucket/x", "unsupported artifact location"),
        ("s3://AKIAEXAMPLE:hunter2@bucket/x", "credentials or options do not belong"),
        ("s3:///x", "no bucket"),
    ],
)
def test_bad_locations_are_one_line(url: str, problem: str, tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=problem) as info:
        artifact_location(url)
    assert "hunter2" not in str(info.value) and "AKIAEXAMPLE" not in str(info.value)
    proc = stepscope(tmp_path, "--artifacts", url, "runs")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and problem in proc.stderr
    assert "hunter2" not in proc.stderr and "AKIAEXAMPLE" not in proc.stderr


@pytest.mark.slow  # a real job under stepscope
def test_window_open_at_the_exit_keeps_the_local_trace(s3: S3, tmp_path: Path) -> None:
    """The job ends inside its capture window: the trace is exported at the exit, when
    s3fs's HTTP client is gone; it stays local, said in one line."""
    run_id, proc = jobs.run_job(
        tmp_path,
        "train.py",
        "--steps",
        "3",
        profile_at=1,
        profile_steps=5,
        extra_env={ARTIFACTS_ENV: f"s3://{s3.bucket}/p"},
    )
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr
    arts = jobs.artifacts(tmp_path, run_id)
    events = jobs.events(tmp_path, run_id)
    kinds = timeline_or_its_line(list(arts["kind"]), list(events["message"]))
    assert list(arts["kind"]) == kinds, list(events["message"])
    assert all(Path(p).is_file() for p in arts["path"])
    lines = list(events.loc[events["source"] == "artifacts", "message"])
    assert sorted(line.split(" ", 1)[0] for line in lines) == sorted(kinds)
    assert all("ended inside the capture window" in line for line in lines)  # one per file
    assert s3.keys() == []
