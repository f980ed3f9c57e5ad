"""`stepscope analyze --ray`: the ranks' work on a real local Ray cluster, traces read
from moto's S3 server (tests/s3_server.py).

The cluster is started once for the module (`ray start --head --block`, about 3 s on
2 cores) in a temporary directory and stopped by its own pid (never `ray stop`, which
stops every Ray cluster of the machine). It starts without any AWS_* variable, so a task
that reads S3 proves that the caller's variables reached it. Without Ray the tests that
need the cluster are skipped with the reason, except under CI (``CI=true``), where a
missing Ray is a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from s3_server import S3, SECRET_ACCESS_KEY, free_port

from stepscope.analyzers.report import ray_pool
from stepscope.analyzers.report.ray_pool import MISSING_RAY, RayPoolError, map_on_ray
from stepscope.analyzers.report.trace_report import analyze_trace
from stepscope.analyzers.trace.load import TraceError, read_json, trace_files
from stepscope.app.cli import analyze as cli_analyze
from stepscope.app.cli.main import build_parser, main
from stepscope.store import RunStore

REPO = Path(__file__).resolve().parents[1]
TWO_RANKS = [REPO / "tests" / "data" / f"sampled_2ranks_rank-{r}.json.gz" for r in (0, 1)]
START_TIMEOUT_S = 120


@dataclass
class Cluster:
    address: str
    temp_dir: Path


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head node on 127.0.0.1 and a free port, 2 CPUs, no dashboard, no usage stats."""
    try:
        import ray
    except ImportError as exc:
        if os.environ.get("CI", "").lower() == "true":
            raise
        pytest.skip(f"ray is not installed ({exc}): pip install -e '.[dev]'")
    port = free_port()
    # short: Ray's unix sockets live under it, and a socket path has at most 107 bytes
    temp_dir = Path(tempfile.mkdtemp(prefix="ss-ray-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RAY_"))}
    # Ray (2.60) turns token auth on where ~/.ray/auth_token exists (a user's own local
    # `ray.init()` leaves one); the drivers here would then need RAY_AUTH_MODE=token.
    env["RAY_AUTH_MODE"] = "disabled"
    log = temp_dir / "start.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
             f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
             "--disable-usage-stats", "--include-dashboard=false", f"--temp-dir={temp_dir}"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=temp_dir,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while b"Ray runtime started" not in log.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start failed:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        yield Cluster(f"127.0.0.1:{port}", temp_dir)
    finally:
        ray.shutdown()
        proc.send_signal(signal.SIGTERM)  # --block: it stops the processes it started
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(temp_dir, ignore_errors=True)


def upload(bucket: S3, files: list[Path], prefix: str) -> list[str]:
    for f in files:
        bucket.client.upload_file(str(f), bucket.bucket, f"{prefix}/{f.name}")
    return [f"s3://{bucket.bucket}/{prefix}/{f.name}" for f in files]


def plain(report_json: dict, *keys: str) -> dict:
    return {k: v for k, v in report_json.items() if k not in ("timings_s", *keys)}


def ray_logs(cluster: Cluster) -> dict[str, bytes]:
    """Every regular file Ray wrote under its temporary directory (logs, session files)."""
    out = {}
    for folder, _dirs, names in os.walk(cluster.temp_dir):
        for name in names:
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                with contextlib.suppress(OSError):  # a file Ray rotates away meanwhile
                    out[str(path)] = path.read_bytes()
    return out


# -- map_on_ray -----------------------------------------------------------------------------
def test_map_on_ray_runs_on_the_cluster_in_order_with_the_callers_s3(
    cluster: Cluster, s3: S3, tmp_path: Path
) -> None:
    files = []
    for i in range(4):
        files.append(tmp_path / f"doc{i}.json")
        files[-1].write_text(json.dumps({"i": i}))
    [uri] = upload(s3, [files[2]], "small")
    calls = [(str(f),) for f in files] + [(uri,)]
    assert map_on_ray(cluster.address, read_json, calls) == [{"i": i} for i in (0, 1, 2, 3, 2)]
    assert map_on_ray(cluster.address, read_json, []) == []
    [pid] = map_on_ray(cluster.address, os.getpid, [()])
    assert pid != os.getpid()  # a worker of the cluster, not this process
    logs = ray_logs(cluster)
    assert logs and not [name for name, text in logs.items() if SECRET_ACCESS_KEY.encode() in text]


def test_a_task_error_reaches_the_caller_as_itself(cluster: Cluster, tmp_path: Path) -> None:
    """Two ranks fail: the caller gets one of the errors (the first to arrive) as it is."""
    ok = tmp_path / "ok.json"
    ok.write_text("{}")
    gone = [tmp_path / "gone.json.gz", tmp_path / "no.json"]
    with pytest.raises(TraceError) as here:
        read_json(gone[0])
    assert str(here.value) == f"{gone[0]}: cannot read (No such file or directory)"
    with pytest.raises(TraceError) as there:
        map_on_ray(cluster.address, read_json, [(str(ok),), *((str(g),) for g in gone)])
    assert type(there.value) is TraceError
    assert str(there.value) in {f"{g}: cannot read (No such file or directory)" for g in gone}


def test_the_task_environment_is_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ray worker runs other tasks afterwards: the caller's variables leave with the call."""
    monkeypatch.delenv("AWS_STEPSCOPE_PROBE", raising=False)
    env = {"AWS_STEPSCOPE_PROBE": "1"}
    assert ray_pool._call_with_env(env, os.environ.get, ("AWS_STEPSCOPE_PROBE",)) == "1"
    assert "AWS_STEPSCOPE_PROBE" not in os.environ


def test_missing_ray_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(RayPoolError) as info:
        map_on_ray("auto", read_json, [("x",)])
    assert str(info.value) == MISSING_RAY == "--ray needs Ray: pip install 'stepscope[ray]'"
    monkeypatch.setenv("STEPSCOPE_HOME", str(tmp_path))
    assert main(["analyze", "--ray", "auto", *map(str, TWO_RANKS)]) == 1
    assert capsys.readouterr().err == f"stepscope: {MISSING_RAY}\n"


# -- s3:// sources --------------------------------------------------------------------------
def test_read_json_reads_s3_like_the_local_file(s3: S3) -> None:
    uris = upload(s3, TWO_RANKS, "job")
    assert read_json(uris[0]) == read_json(TWO_RANKS[0])
    missing = f"s3://{s3.bucket}/job/rank-9.json.gz"
    with pytest.raises(TraceError) as info:
        read_json(missing)
    assert str(info.value) == f"{missing}: object missing"
    assert trace_files([missing]) == [missing]  # one source, read where it is analysed
    assert trace_files([f"s3://{s3.bucket}/job/"]) == uris  # a prefix: its traces
    with pytest.raises(TraceError, match=r"^s3://.*/nothing/: holds no \*\.json"):
        trace_files([f"s3://{s3.bucket}/nothing/"])


# -- the report and the CLI -----------------------------------------------------------------
def test_analyze_trace_on_ray_equals_in_process(cluster: Cluster, s3: S3) -> None:
    here = analyze_trace(TWO_RANKS, workers=1).to_json()
    on_ray = analyze_trace(TWO_RANKS, ray_address=cluster.address).to_json()
    assert plain(on_ray) == plain(here)
    uris = upload(s3, TWO_RANKS, "job")
    from_s3 = analyze_trace(uris, ray_address=cluster.address).to_json()
    assert from_s3["paths"] == uris
    assert plain(from_s3, "paths") == plain(here, "paths")


def test_cli_ray_gives_the_same_json(
    cluster: Cluster, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relative paths too: the CLI names them absolutely for the cluster's tasks."""
    relative = [str(f.relative_to(REPO)) for f in TWO_RANKS]
    home = tmp_path / "home"
    proc = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "analyze",
         "--ray", cluster.address, *relative, "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no Ray banner, no task output on the user's terminal
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    assert main(["analyze", "--workers", "1", *map(str, TWO_RANKS), "--json"]) == 0
    assert plain(json.loads(proc.stdout)) == plain(json.loads(capsys.readouterr().out))


def test_cli_flags(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("STEPSCOPE_RAY", "ray://head:10001")
    args = build_parser().parse_args(["analyze", "x"])
    assert (args.ray, args.workers) == ("ray://head:10001", None)
    args = build_parser().parse_args(["analyze", "--ray", "auto", "--workers", "3", "x"])
    assert (args.ray, args.workers) == ("auto", 3)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["analyze", "--help"])
    text = capsys.readouterr().out
    assert "--workers N" in text and "--ray ADDRESS" in text and "STEPSCOPE_RAY" in text
    with pytest.raises(SystemExit):
        main(["analyze", "--workers", "0", "x"])


def test_a_run_in_s3_goes_to_ray_as_its_uris(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --ray each task reads its own rank from the object store: the URIs, not the
    local copies the client would make."""
    monkeypatch.setenv("STEPSCOPE_HOME", str(tmp_path))
    monkeypatch.delenv("STEPSCOPE_STORE", raising=False)
    monkeypatch.setenv("STEPSCOPE_ARTIFACTS", "s3://bucket")  # where the job uploaded them
    uris = [f"s3://bucket/runs/1/{f.name}" for f in TWO_RANKS]
    with RunStore(tmp_path) as store:
        run_id = store.create_run(["python", "train.py"])
        locals_ = [store.run_dir(run_id) / f.name for f in TWO_RANKS]  # the job's own copies
        for rank, (uri, local) in enumerate(zip(uris, locals_, strict=True)):
            shutil.copyfile(TWO_RANKS[rank], local)
            store.add_artifact(run_id, "trace", uri, rank=rank, meta={"local_path": str(local)})
    assert cli_analyze.resolve_paths([str(run_id)], remote=True) == (uris, [run_id])
    assert cli_analyze.resolve_paths([str(run_id)]) == (locals_, [run_id])
    # a local path is made absolute for the cluster, whose tasks run in other folders
    monkeypatch.chdir(REPO)
    relative = str(TWO_RANKS[0].relative_to(REPO))
    assert cli_analyze.resolve_paths([relative]) == ([Path(relative)], [])
    assert cli_analyze.resolve_paths([relative], remote=True) == ([TWO_RANKS[0]], [])


def test_an_unreachable_address_is_one_line_naming_it(cluster: Cluster) -> None:
    """Last: it ends this process's connection to the module's cluster."""
    address = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(RayPoolError) as info:
        map_on_ray(address, read_json, [("x",)])
    assert time.monotonic() - t0 < 30  # Ray alone waits minutes
    assert str(info.value).startswith(f"Ray cluster at {address}: unreachable (")
    assert "\n" not in str(info.value)
    with pytest.raises(RayPoolError, match="not an address"):
        map_on_ray("host:port", read_json, [("x",)])
