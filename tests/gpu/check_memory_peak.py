"""Checks "where the peak goes" on a CUDA machine: run by hand, not by pytest.

    PYTHONPATH=/path/to/repo python tests/gpu/check_memory_peak.py

Records tests/jobs/memory_blocks.py on the GPU with `stepscope run` and a 2-step
capture, then checks: a memory_timeline artifact for the CUDA device, the peak's
categories adding up to the timeline's peak, parameters equal to the model's bytes,
activations present, the blocks' modules found from the trace, and the allocator's
reserved-but-unused bytes reported. Prints PASS/FAIL lines; exits 1 if any fails.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from stepscope.analyzers.report.run_memory import run_memory  # noqa: E402
from stepscope.store import RunStore  # noqa: E402

failures = 0


def check(name: str, ok: bool, detail: str = "") -> None:
    global failures
    failures += 0 if ok else 1
    print(f"{'PASS' if ok else 'FAIL'}  {name}{'  (' + detail + ')' if detail else ''}", flush=True)


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="stepscope-gpu-mem-"))
    job = [sys.executable, str(REPO / "tests/jobs/memory_blocks.py"), "--device", "cuda"]
    job += ["--steps", "6", "--batch", "16", "--seq", "256", "--width", "256", "--blocks", "4"]
    cli = [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "run"]
    proc = subprocess.run(
        [*cli, "--profile-at", "2", "--profile-steps", "2", "--", *job],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    check("job completed", proc.returncode == 0, proc.stderr[-500:])
    params = int(re.search(r"^params (\d+)$", proc.stdout, re.M).group(1))
    with RunStore(home) as store:
        run_id = store.resolve_run("last")
        arts = store.artifacts(run_id)
        tl = arts[arts["kind"] == "memory_timeline"]
        check("memory_timeline artifact", len(tl) == 1, str(list(arts["kind"])))
        if len(tl) == 0:
            print(list(store.events(run_id)["message"]))
            return 1
        check("on the CUDA device", tl["meta"].iloc[0].get("device") == "cuda:0")
        print("export_s", tl["meta"].iloc[0].get("export_s"))
        b = run_memory(store, run_id)
    print(b.peak.to_string())
    print(b.modules.head(6).to_string())
    check("no problems", b.problems == [], str(b.problems))
    check("categories add up", int(b.peak["bytes"].sum()) == b.peak_bytes)
    by = b.peak.set_index("category")["bytes"]
    check("parameters", by["PARAMETER"] == params, f"{by['PARAMETER']} vs {params}")
    check("activations", by["ACTIVATION"] > 0)
    check("modules", (b.modules["module"] == "Block_0").any(), str(list(b.modules["module"])))
    check(
        "reserved unused reported",
        b.reserved_unused_bytes is not None,
        str(b.reserved_unused_bytes),
    )
    out = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "memory", "last"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    check("stepscope memory", out.returncode == 0 and "cuda:0" in out.stdout, out.stderr)
    print(out.stdout)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
