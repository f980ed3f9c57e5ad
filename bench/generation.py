"""Generation jobs under stepscope: what was recorded against what each script counted.

    python bench/generation.py                      # every job, the sweep on hf_generate
    python bench/generation.py --only hf_generate --json bench/results/generation.json

For each generation job of the corpus (``examples/corpus/``, at its own defaults unless
``--small``), ``stepscope run`` records it once; the script prints its own counts and
its own ``perf_counter`` latency per request on its last line (``CORPUS {...}``). The
table: requests and new tokens recorded against the script's, the largest request
latency error against the script's clock (the first request left out for hand-written
loops: a loop's request starts at its first model call), tokens/s, TTFT and TPOT p50,
the diagnosis's first finding and first fix. For the ``generate()`` jobs it then runs
the batch sweep (``stepscope optimize --sweep batch``: the job's own prompts, batched)
and reports the best batch's tokens/s against batch 1 with its 95 % interval and the
share of generated tokens identical to batch 1's.

Figures are this machine's: on a shared 2-core VM the ratios widen with the load (the
contention line says how much other work ran).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from stepscope.analyzers.rules.diagnosis import diagnose_run
from stepscope.analyzers.steps.generation import generation_summary, request_table
from stepscope.collectors.launch.launcher import launch_run
from stepscope.optim_runner.sweeps.sweep import run_sweep
from stepscope.store import RunStore

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "examples" / "corpus"
# job -> (its arguments at bench size, at --small size, sweep it?)
JOBS: dict[str, tuple[tuple[str, ...], tuple[str, ...], bool]] = {
    "hf_generate": ((), ("--num-prompts", "8", "--prompt-len", "32", "--n-layer", "2"), True),
    "hf_pipeline": ((), ("--num-prompts", "4", "--n-layer", "2"), True),
    "nanogpt_sample": ((), ("--num_samples", "2", "--max_new_tokens", "40"), False),
    "kv_cache_loop": ((), ("--num-prompts", "3", "--max-new-tokens", "16"), False),
    "hf_sampling": ((), ("--num-prompts", "4", "--batch-size", "2"), True),
    "llama_reference": ((), ("--num-prompts", "3", "--max-gen-len", "16"), False),
}


def own_counts(log: Path) -> dict[str, Any]:
    line = next(ln for ln in reversed(log.read_text().splitlines()) if ln.startswith("CORPUS "))
    return json.loads(line[len("CORPUS ") :])


def one(home: Path, name: str, small: bool, sweep: bool, sizes: list[int]) -> dict[str, Any]:
    args, small_args, sweepable = JOBS[name]
    log = home / f"{name}.log"
    command = [sys.executable, str(CORPUS / f"{name}.py"), *(small_args if small else args)]
    run_id, code = launch_run(command, home=home, quiet=True, cwd=REPO, output_path=str(log))
    row: dict[str, Any] = {"job": name, "run": run_id, "exit_code": code}
    own = own_counts(log)
    with RunStore(home) as store:
        requests, steps = store.requests(run_id), store.steps(run_id)
        summary = generation_summary(requests, steps) or {}
        table = request_table(requests)
        loop = set(requests["source"]) == {"loop"}
        recorded = table["latency_s"].tolist()
        theirs = own.get("latencies_s") or []
        pairs = list(zip(recorded, theirs, strict=False))[1 if loop else 0 :]
        errors = [abs(a - b) / b for a, b in pairs if b]
        diagnosis = diagnose_run(store, run_id)
        first = diagnosis.findings[0] if diagnosis.findings else None
        row.update(
            requests=summary.get("requests"),
            own_requests=own.get("requests", len(theirs)),
            new_tokens=summary.get("new_tokens"),
            own_new_tokens=sum(own.get("new_tokens") or []),
            steps=len(steps),
            latency_error_max=max(errors) if errors else None,
            tokens_per_s=summary.get("tokens_per_s"),
            ttft_p50_s=(summary.get("ttft_s") or {}).get("p50"),
            tpot_p50_s=(summary.get("tpot_s") or {}).get("p50"),
            first_finding=first.key if first else None,
            first_fix=first.fixes[0].id if first and first.fixes else None,
        )
        if sweep and sweepable:
            result = run_sweep(store, run_id, sizes, steps=min(16, row["requests"] or 1))
            best = max(
                (r for r in result["rows"] if r.get("speedup")),
                key=lambda r: r["speedup"],
                default=None,
            )
            row["sweep"] = {
                "best_batch": best["batch_size"] if best else None,
                "speedup": best["speedup"] if best else None,
                "ci": best["ci"] if best else None,
                "token_agreement": best["token_agreement"] if best else None,
                "knee": (result.get("knee") or {}).get("batch_size"),
                "rows": result["rows"],
                "contention": (result.get("contention") or {}).get("warning"),
            }
    return row


def describe(row: dict[str, Any]) -> str:
    err = row["latency_error_max"]
    lines = [
        f"{row['job']}: requests {row['requests']} (script {row['own_requests']}), new tokens "
        f"{row['new_tokens']} (script {row['own_new_tokens']}), steps {row['steps']}; "
        f"latency error max {'-' if err is None else f'{100 * err:.1f} %'}; "
        f"{row['tokens_per_s'] or 0:.1f} tokens/s; first finding {row['first_finding']} "
        f"-> {row['first_fix']}"
    ]
    sweep = row.get("sweep")
    if sweep:
        ci = sweep["ci"]
        ci_text = f" (95 % CI {ci[0]:.2f}-{ci[1]:.2f})" if ci else ""
        agreement = sweep["token_agreement"]
        lines.append(
            f"  batch sweep: best batch {sweep['best_batch']} {sweep['speedup']}x tokens/s"
            f"{ci_text}, {'-' if agreement is None else f'{100 * agreement:.1f} %'} tokens "
            f"identical; knee {sweep['knee']}"
        )
        if sweep.get("contention"):
            lines.append(f"  contention: {sweep['contention']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", choices=sorted(JOBS), action="append", help="one job (repeatable)"
    )
    parser.add_argument("--small", action="store_true", help="small sizes (a quick check)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the batch sweeps")
    parser.add_argument("--sizes", default="1,2,4,8,16", help="batch sizes of the sweep")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS (default 1)")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # recorded with the run, replayed
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-generation-") as tmp:
        os.environ["STEPSCOPE_HOME"] = tmp
        for name in args.only or list(JOBS):
            row = one(Path(tmp), name, args.small, not args.no_sweep, sizes)
            print(describe(row), flush=True)
            rows.append(row)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
