"""Checks generation on a CUDA machine, the way a user runs it: by hand, not by pytest.

    PYTHONPATH=/path/to/repo python tests/gpu/check_generation.py [--home DIR] [--quick]

Records the corpus's `hf_generate.py` (a GPT-2 small from its config, random weights,
greedy `generate()` one prompt at a time) and `kv_cache_loop.py` (a hand-written decode
loop over a Llama) on the GPU with `stepscope run`, diagnoses the first, then runs
`stepscope optimize` with the static cache and the compiled decode step (CUDA graphs)
and a batch sweep. Checks what happened: one request per call with its tokens, TTFT and
the CUDA peak; a trace of profiled requests with CUDA kernels; lossless fixes that keep
every greedy token; a sweep whose answers agree. The speed-ups are printed, not
asserted. PASS/FAIL lines; exit 1 if any check fails.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from stepscope.store import RunStore  # noqa: E402

CORPUS = REPO / "examples" / "corpus"
PROMPTS, NEW_TOKENS = 12, 64
GPT2_SMALL = ["--n-layer", "12", "--n-embd", "768", "--n-head", "12", "--vocab-size", "50257"]
DEVICE = "cuda"
failures = 0


def check(name: str, ok: bool, detail: str = "") -> None:
    global failures
    failures += 0 if ok else 1
    print(f"{'PASS' if ok else 'FAIL'}  {name}{'  (' + detail + ')' if detail else ''}", flush=True)


def cli(home: Path, *args: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    print(f"      $ stepscope {' '.join(args)}  -> rc {out.returncode}, "
          f"{time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
    if out.returncode != 0:
        print(out.stderr[-3000:])
    return out


def last_run(home: Path) -> int:
    with RunStore(home) as store:
        return int(store.runs()["id"].max())


def check_generate_run(home: Path, trace: bool = True) -> int:
    job = [sys.executable, str(CORPUS / "hf_generate.py"), *GPT2_SMALL, "--device", DEVICE]
    job += ["--num-prompts", str(PROMPTS), "--max-new-tokens", str(NEW_TOKENS)]
    profile = ["--profile-at", "4", "--profile-steps", "2"] if trace else []
    out = cli(home, "run", *profile, "--", *job)
    check("hf_generate: stepscope run exits 0", out.returncode == 0)
    run_id = last_run(home)
    corpus = next(
        (json.loads(ln[7:]) for ln in out.stdout.splitlines() if ln.startswith("CORPUS ")), {}
    )
    with RunStore(home) as store:
        req = store.requests(run_id)
        arts = store.artifacts(run_id)
    done = req[req["status"] == "done"]
    check("one request per generate() call", len(done) == PROMPTS, f"{len(done)} of {len(req)}")
    check(
        "new tokens counted per request",
        list(done["new_tokens"]) == corpus.get("new_tokens"),
        f"{sorted(set(done['new_tokens']))}",
    )
    latency = (done["end_s"] - done["start_s"]).to_numpy()
    theirs = corpus.get("latencies_s", [])
    if len(theirs) == len(latency):
        # a profiled request's own timer also holds the trace export, which is not ours
        timed = (done["profiled"] == 0).to_numpy()
        ours, theirs = latency[timed], [t for t, keep in zip(theirs, timed, strict=True) if keep]
        gap = max(abs(a - b) / b for a, b in zip(ours, theirs, strict=True))
        check("request latency matches the job's own timer", gap < 0.1, f"max gap {gap:.1%}")
        if gap >= 0.1:
            print(f"      ours   {[round(x * 1e3, 1) for x in ours]} ms")
            print(f"      theirs {[round(x * 1e3, 1) for x in theirs]} ms")
    check(
        "TTFT inside the request",
        bool(((done["ttft_s"] > 0) & (done["ttft_s"] < latency)).all()),
        f"median TTFT {done['ttft_s'].median() * 1e3:.2f} ms, "
        f"median request {float(sorted(latency)[len(latency) // 2]) * 1e3:.1f} ms",
    )
    peak = done["peak_cuda_bytes"].dropna()
    check(
        "CUDA peak per request",
        len(peak) == len(done) and bool((peak > 0).all()),
        f"median {peak.median() / 2**20:.0f} MiB" if len(peak) else "none",
    )
    traces = arts[arts["kind"] == "trace"]
    if trace:
        check("a trace of the profiled requests", len(traces) == 1, f"{len(traces)}")
    if trace and len(traces):
        with gzip.open(traces["path"].iloc[0], "rt") as f:
            events = json.load(f)["traceEvents"]
        kernels = [e for e in events if e.get("cat") == "kernel"]
        check("the trace has CUDA kernels", len(kernels) > 0, f"{len(kernels)} kernels")
    show = cli(home, "show", str(run_id), "--json")
    gen = json.loads(show.stdout).get("generation") if show.returncode == 0 else None
    check("show --json has a generation summary", bool(gen))
    if gen:
        print(f"      tokens/s {gen.get('tokens_per_s')}, TPOT {gen.get('tpot_s')}")
    return run_id


def check_diagnosis(home: Path, run_id: int) -> None:
    out = cli(home, "analyze", str(run_id), "--json")
    findings: list[dict[str, Any]] = json.loads(out.stdout)["findings"] if out.stdout else []
    for f in findings:
        fixes = [(x["id"], x.get("predicted_speedup")) for x in f.get("fixes") or []]
        print(f"      finding: {f['class']}/{f['subtype']} share {f['share']} "
              f"confidence {f['confidence']}: {f['title']}; fixes {fixes}")  # fmt: skip
        for item in (f.get("evidence") or [])[:4]:
            print(f"        evidence: {item['text']}")
    subtypes = [f["subtype"] for f in findings]
    check("decode at batch one is diagnosed", "decode_batch_one" in subtypes, str(subtypes))


def print_trial_log(home: Path, runs: list[int]) -> None:
    """What a trial's job said: why an arm did not complete."""
    with RunStore(home) as store:
        for run in runs[:1]:
            for _, e in store.events(run).iterrows():
                print(f"        run {run} log: {e['level']} {e['source']}: {e['message']}")
            log = store.run_dir(run) / "output.log"
            if log.exists():
                print("        output.log: " + log.read_text()[-1500:].replace("\n", "\n        "))


def check_fixes(home: Path, run_id: int, fixes: str) -> None:
    out = cli(
        home,
        *("optimize", str(run_id), "--fixes", fixes),
        *("--steps", str(PROMPTS), "--trials", "2", "--json"),
    )
    if out.returncode != 0:
        check("optimize with the static cache fixes", False)
        return
    result = json.loads(out.stdout)
    check("judged by tokens", result.get("guard") == "tokens", str(result.get("guard")))
    for cand in result["candidates"]:
        q = cand.get("quality") or {}
        print(f"      arm {cand['name']}: {cand['status']} speed-up {cand.get('speedup')} "
              f"ci {cand.get('ci')} p50 {(cand.get('latency') or {}).get('p50')} "
              f"tokens {q.get('agreement')} {q.get('reason')} {cand.get('error') or ''}")  # fmt: skip
        if cand["status"] != "completed":
            print_trial_log(home, [*(cand.get("runs") or []), *[cand.get("failed_run")]])
        if cand["name"] in ("static_cache", "static_cache_compile"):
            check(
                f"{cand['name']}: completed, every greedy token kept",
                cand["status"] == "completed" and q.get("agreement") == 1.0,
                f"{cand['status']}, agreement {q.get('agreement')}",
            )


def check_sweep(home: Path, run_id: int) -> None:
    out = cli(
        home,
        *("optimize", str(run_id), "--sweep", "batch", "--batch-factors", "1,4,12"),
        *("--steps", str(PROMPTS), "--trials", "2", "--json"),
    )
    if out.returncode != 0:
        check("batch sweep", False)
        return
    sweep = json.loads(out.stdout)
    for row in sweep["rows"]:
        print(f"      batch {row['batch_size']}: {row['status']} {row.get('tokens_per_s')} tok/s "
              f"x{row.get('speedup')} ci {row.get('ci')} same tokens {row.get('token_agreement')}")  # fmt: skip
    check(
        "sweep: every batch size completed",
        all(r["status"] == "completed" for r in sweep["rows"]),
    )
    print(f"      knee {sweep.get('knee')}")


def check_decode_loop(home: Path) -> None:
    job = [sys.executable, str(CORPUS / "kv_cache_loop.py"), "--device", DEVICE]
    out = cli(home, "run", "--", *job)
    check("kv_cache_loop: stepscope run exits 0", out.returncode == 0)
    with RunStore(home) as store:
        req = store.requests(last_run(home))
    done = req[req["status"] == "done"]
    check(
        "hand-written decode loop read as requests",
        len(done) > 0 and bool((done["new_tokens"] > 1).all()),
        f"{len(done)} requests, new tokens {sorted(set(done['new_tokens']))[:5]}, "
        f"CUDA peak {done['peak_cuda_bytes'].median() / 2**20:.0f} MiB",
    )


def main() -> int:
    import torch

    p = argparse.ArgumentParser()
    p.add_argument("--home", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="record and diagnose only")
    p.add_argument("--fixes", default="static_cache,static_cache_compile", help="to optimize with")
    p.add_argument("--no-loop", action="store_true", help="leave the decode loop out")
    p.add_argument("--no-trace", action="store_true", help="record without a profiler capture")
    p.add_argument("--no-sweep", action="store_true", help="leave the batch sweep out")
    p.add_argument("--cpu-dry-run", action="store_true", help="the script's own test, on a CPU")
    args = p.parse_args()
    if args.cpu_dry_run:
        global DEVICE
        DEVICE = "cpu"
        GPT2_SMALL.clear()
    elif not torch.cuda.is_available():
        print("FAIL  no CUDA device visible to torch")
        return 1
    home = args.home or Path(tempfile.mkdtemp(prefix="stepscope_gpu_gen_"))
    run_id = check_generate_run(home, trace=not args.no_trace)
    check_diagnosis(home, run_id)
    if not args.no_loop:
        check_decode_loop(home)
    if not args.quick:
        check_fixes(home, run_id, args.fixes)
        if not args.no_sweep:
            check_sweep(home, run_id)
    print(f"{'ALL PASS' if failures == 0 else f'{failures} FAILED'}  (store: {home})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
