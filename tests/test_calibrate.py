"""`stepscope calibrate`: a real (tiny) measurement, its cache, and the CLI's JSON; and
`calibrate --noise`: real whole runs of its fixed job, their spread, its cache entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from stepscope.collectors.facts.calibrate import calibrate, matmul_size
from stepscope.optim_runner.check.run_noise import spread_of
from stepscope.store.calibration import (
    CACHE_FILE,
    NoiseCalibration,
    cached_calibration,
    cached_noise,
    calibration_path,
    host_name,
    save_calibration,
)

ROOT = Path(__file__).resolve().parents[1]


def test_a_short_calibration_measures_positive_figures_and_restores_threads() -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    seen: list[str] = []
    cal = calibrate("float32", threads=1, seconds=0.2, progress=seen.append, stream_bytes=8 << 20)
    assert torch.get_num_threads() == before
    assert cal.matmul_gflops > 0 and cal.copy_gbs > 0 and cal.triad_gbs > 0
    assert cal.threads == 1 and cal.dtype == "float32" and cal.repeats >= 3
    assert cal.host == host_name() and cal.cpu_model and cal.torch_version == torch.__version__
    assert cal.date[:4].isdigit() and "T" in cal.date and cal.stream_mib == 8.0
    assert len(seen) == 2 and "matmul" in seen[0] and "triad" in seen[1]
    assert "1 thread," in cal.conditions()


def test_bfloat16_and_bad_arguments() -> None:
    pytest.importorskip("torch")
    cal = calibrate("bfloat16", threads=1, seconds=0.1, stream_bytes=4 << 20)
    assert cal.dtype == "bfloat16" and cal.matmul_gflops > 0
    with pytest.raises(ValueError, match="not a torch floating-point dtype"):
        calibrate("int8", seconds=0.1)
    with pytest.raises(ValueError, match="threads"):
        calibrate(threads=0, seconds=0.1)


def test_matmul_size_fits_the_cache_within_bounds() -> None:
    assert matmul_size(4, 8 << 20) == 768  # 3 x 768^2 x 4 B = 6.75 MiB <= 8 MiB
    assert matmul_size(4, 1 << 10) == 256 and matmul_size(2, 1 << 34) == 2048


def test_the_cache_is_keyed_by_host_dtype_and_threads(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    assert cached_calibration(tmp_path, "float32", 1) is None
    cal = calibrate("float32", threads=1, seconds=0.1, stream_bytes=4 << 20)
    path = save_calibration(tmp_path, cal)
    assert path == calibration_path(tmp_path) == tmp_path / CACHE_FILE
    assert cached_calibration(tmp_path, "float32", 1) == cal
    assert cached_calibration(tmp_path, "bfloat16", 1) is None
    assert cached_calibration(tmp_path, "float32", 2) is None
    assert cached_calibration(tmp_path, "float32", 1, host="another-host") is None
    # threads=None takes the most threads measured; a second entry keeps the first
    wider = replace(cal, threads=8, matmul_gflops=cal.matmul_gflops * 2)
    save_calibration(tmp_path, wider)
    assert cached_calibration(tmp_path, "float32") == wider
    assert cached_calibration(tmp_path, "float32", 1) == cal
    doc = json.loads(path.read_text())
    assert doc["version"] == 1 and len(doc["entries"]) == 2


def test_a_broken_cache_reads_as_empty_and_is_replaced(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / CACHE_FILE).write_text("{not json")
    assert cached_calibration(tmp_path, "float32", 1) is None
    cal = calibrate("float32", threads=1, seconds=0.1, stream_bytes=4 << 20)
    save_calibration(tmp_path, cal)
    assert cached_calibration(tmp_path, "float32", 1) == cal
    assert [p.name for p in tmp_path.iterdir()] == [CACHE_FILE]  # no temp file left


def test_cli_json_measures_and_caches(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "STEPSCOPE_HOME": str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "stepscope.app.cli", "calibrate", "--json", "--threads", "1",
           "--seconds", "0.3"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["threads"] == 1 and out["dtype"] == "float32"
    assert out["matmul_gflops"] > 0 and out["triad_gbs"] > 0 and out["copy_gbs"] > 0
    assert out["cache"] == str(tmp_path / CACHE_FILE)
    cached = cached_calibration(tmp_path, "float32", 1)
    assert cached is not None and cached.matmul_gflops == out["matmul_gflops"]


def test_cli_table_says_where_it_cached(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "STEPSCOPE_HOME": str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "stepscope.app.cli", "calibrate", "--dtype", "bfloat16",
           "--threads", "1", "--seconds", "0.2"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "calibrating" in done.stderr and "matmul" in done.stderr
    for word in ("GFLOP/s", "GB/s", "bfloat16", "1 thread", str(tmp_path / CACHE_FILE)):
        assert word in done.stdout
    assert cached_calibration(tmp_path, "bfloat16", 1) is not None


# -- calibrate --noise: the host's run-to-run spread -----------------------------------------
def test_cli_noise_records_whole_runs_in_a_store_of_its_own(tmp_path: Path) -> None:
    """Real runs of the fixed job, each its own process; the result cached beside the
    peak, and the runs themselves never in the user's store ($STEPSCOPE_STORE)."""
    home, team_store = tmp_path / "home", tmp_path / "team.db"
    env = {**os.environ, "STEPSCOPE_HOME": str(home), "STEPSCOPE_STORE": str(team_store)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "stepscope.app.cli", "calibrate", "--noise", "--runs", "2",
           "--steps", "30", "--json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["kind"], out["runs"], out["steps"], out["threads"]) == ("noise", 2, 30, 1)
    assert set(out["cv"]) == {"median", "mean", "p99"}
    assert all(v >= 0 for v in out["cv"].values()) and out["step_s"] > 0
    assert out["host"] == host_name() and out["cache"] == str(home / CACHE_FILE)
    assert done.stderr == ""  # --json: no progress lines
    noise = cached_noise(home)
    assert noise is not None and noise.cv == out["cv"] and noise.runs == 2
    assert "calibrate --noise" in noise.conditions() and "2 runs of 30" in noise.conditions()
    assert not team_store.exists()  # the fixed job's runs went to a temporary store
    assert cached_calibration(home, "float32") is None  # the peak's entries are apart
    bad = subprocess.run([*cmd[:5], "--runs", "1"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "at least 2 runs" in bad.stderr


def test_noise_and_peak_entries_share_the_cache(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    cal = calibrate("float32", threads=1, seconds=0.1, stream_bytes=4 << 20)
    save_calibration(tmp_path, cal)
    noise = NoiseCalibration(
        cv={"median": 0.04, "mean": 0.05, "p99": 0.2}, runs=5, steps=300, step_s=0.003,
        threads=1, host=host_name(), cpu_model="x", torch_version="t",
        date="2026-11-28T10:00:00+00:00", load=(1.0, 2.0), seconds=30.0,
    )  # fmt: skip
    save_calibration(tmp_path, noise)
    assert cached_noise(tmp_path) == noise and cached_noise(tmp_path, "another-host") is None
    assert cached_calibration(tmp_path, "float32", 1) == cal
    assert cached_calibration(tmp_path, "float32") == cal  # the noise entry is no peak
    assert spread_of([{"m": 1.0}, {"m": 1.1}, {"m": 0.9}])["m"] == pytest.approx(
        float(np.std(np.log([1.0, 1.1, 0.9]), ddof=1))
    )
