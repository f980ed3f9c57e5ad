"""Checks that advice fits a CUDA job (issue 27), as a user gets it.

    PYTHONPATH=/path/to/repo python tests/gpu/check_advice.py [--home DIR] [--cpu-dry-run]

Records `tests/gpu/cuda_job.py --fp32` (training, default capture) and a tiny GPT-2
`generate()` job (inference), then reads `stepscope analyze --json` of each: a CUDA
training job keeps the GPU figures (bf16's Tensor Core citation, where bf16 is offered);
no fix's bound passes the Amdahl bound of the phase it names; the generation job gets
no backward, optimizer or training citation in any fix; and the first finding of the
generation job is printed with its fixes (a first finding without a fix was seen on an
H200: that is a finding worth knowing). PASS/FAIL lines; exit 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import check_generation as gen

JOB = str(gen.REPO / "tests" / "gpu" / "cuda_job.py")
CORPUS = gen.REPO / "examples" / "corpus"
TRAINING_WORDS = ("loss.backward", "optimizer.step", "training speed-up")


def analysis(home: Path, run_id: int) -> dict:
    out = gen.cli(home, "analyze", str(run_id), "--json")
    gen.check(f"run {run_id}: analyze exits 0", out.returncode == 0, out.stderr[-300:])
    return json.loads(out.stdout) if out.returncode == 0 else {"findings": []}


def fixes_of(report: dict) -> list[dict]:
    return [fix for finding in report["findings"] for fix in finding["fixes"]]


def bounds_hold(fixes: list[dict]) -> bool:
    """'removes up to X % of the optimizer step's Y %': predicted <= 1 / (1 - X*Y)."""
    ok = True
    for fix in fixes:
        m = re.search(
            r"removes up to (\d+) % of the [\w ]+'s (\d+(?:\.\d)?) %", fix.get("basis") or ""
        )
        if m and fix.get("predicted_speedup"):
            bound = 1 / (1 - float(m.group(1)) * float(m.group(2)) / 1e4)
            ok &= fix["predicted_speedup"] <= bound + 0.01
            print(
                f"      {fix['id']}: {fix['predicted_speedup']:.2f}x <= {bound:.2f}x ({m.group(0)})"
            )
    return ok


def show(report: dict) -> None:
    for finding in report["findings"][:3]:
        print(f"      {finding['class']}/{finding['subtype']} {finding['share']:.0%}")
        for fix in finding["fixes"]:
            print(f"        {fix['id']}: {fix.get('predicted_speedup')} | {fix.get('basis')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--cpu-dry-run", action="store_true")
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="stepscope-advice-"))
    cpu = args.cpu_dry_run
    out = gen.cli(
        home,
        "run",
        "--max-steps",
        "30",
        "--",
        sys.executable,
        JOB,
        "--fp32",
        *(["--cpu"] if cpu else []),
    )
    gen.check("training job: stepscope run exits 0", out.returncode == 0, out.stderr[-300:])
    train = analysis(home, gen.last_run(home))
    show(train)
    fixes = fixes_of(train)
    bf16 = [f for f in fixes if f["id"] == "bf16_autocast"]
    if bf16 and not cpu:
        gen.check(
            "CUDA training: bf16 keeps its GPU figure",
            bf16[0].get("predicted_speedup") is not None
            and "no cited figure" not in (bf16[0].get("basis") or ""),
            str(bf16[0].get("basis")),
        )
    gen.check("training: every phase bound holds", bounds_hold(fixes))

    job = [sys.executable, str(CORPUS / "hf_generate.py"), *([] if cpu else gen.GPT2_SMALL)]
    job += ["--device", "cpu" if cpu else "cuda", "--num-prompts", "6", "--max-new-tokens", "16"]
    out = gen.cli(home, "run", "--", *job)
    gen.check("generation job: stepscope run exits 0", out.returncode == 0, out.stderr[-300:])
    generate = analysis(home, gen.last_run(home))
    show(generate)
    said = json.dumps(fixes_of(generate))
    gen.check(
        "generation: no training advice",
        not any(w in said for w in TRAINING_WORDS),
        repr([w for w in TRAINING_WORDS if w in said]),
    )
    gen.check("generation: every phase bound holds", bounds_hold(fixes_of(generate)))
    print(f"{'ALL PASS' if gen.failures == 0 else f'{gen.failures} FAILED'}  (store: {home})")
    return 1 if gen.failures else 0


if __name__ == "__main__":
    sys.exit(main())
