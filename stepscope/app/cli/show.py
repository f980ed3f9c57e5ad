"""`stepscope show RUN`: one run's summary, as JSON or as tables.

The JSON form is the contract (tests and scripts read it); the tables are the same
data for people. Both are built from one dict (``run_summary``), so they cannot
disagree.

The run's diagnosis comes with it (``diagnosis``): as saved by the verdict at the job's
end or by `analyze`, or made now for a run that ended after it was last diagnosed (a job
whose launcher was killed, a run recorded before verdicts). A diagnosis that fails gives
its one-line ``error``; the rest of the summary is shown all the same.

A run that served generation requests gets ``generation`` (``generation_summary``: per
request, never per forward) and no ``latency``: that block reads each step as one
request, which holds for a classifier's forward steps but would turn a request's tokens
into hundreds of tiny "requests".
"""

from __future__ import annotations

from typing import Any

from stepscope.analyzers.rules.diagnosed import saved_diagnosis
from stepscope.app.applied import applied_changes, state, trial_label
from stepscope.app.cli import term
from stepscope.app.cli.memory_section import print_memory_section, with_lines
from stepscope.app.cli.runs import run_duration
from stepscope.app.cli.show_kept import show_figures
from stepscope.app.cli.term import esc, print_json, status_text
from stepscope.app.cli.verdict import verdict_lines
from stepscope.app.formats import (
    fmt_bytes,
    fmt_num,
    fmt_pct,
    fmt_s,
    fmt_time,
    fmt_value,
    steps_recorded,
)
from stepscope.app.kv_cache_text import kv_cache_line
from stepscope.errors import one_line_error
from stepscope.store import RunStore

# Samples shown in the readable view of `show` (JSON carries every metric).
_SHOWN_SAMPLES = (
    ("proc.cpu_percent", "job CPU %", "pct"),
    ("proc.cpu_max_process_percent", "busiest process CPU %", "pct"),
    ("proc.cpu_max_thread_percent", "busiest thread CPU %", "pct"),
    ("proc.rss_bytes", "job RSS", "bytes"),
    ("proc.children", "child processes", "num"),
    ("proc.read_bytes_per_s", "job disk read", "rate"),
    ("system.cpu_percent", "machine CPU %", "pct"),
    ("system.iowait_percent", "machine iowait %", "pct"),
    ("system.mem_used_bytes", "machine memory used", "bytes"),
    ("system.disk_read_bytes_per_s", "machine disk read", "rate"),
)
_LATENCY_ROWS = (
    ("p50_s", "p50"),
    ("p90_s", "p90"),
    ("p95_s", "p95"),
    ("p99_s", "p99"),
    ("max_s", "max"),
    ("mean_s", "mean"),
)
# The generation block's distributions: key of ``generation_summary``, label.
_GENERATION_ROWS = (
    ("request_s", "request latency"),
    ("ttft_s", "time to first token"),
    ("tpot_s", "time per output token"),
)
_GPU_SHOWN = (
    ("util_percent", "GPU util %", "pct"),
    ("mem_used_bytes", "GPU memory used", "bytes"),
    ("job_mem_used_bytes", "job GPU memory", "bytes"),
    ("power_w", "GPU power W", "num"),
)


def run_summary(store: Any, run_id: int) -> dict[str, Any]:
    """Everything `show` prints about one run but its diagnosis: the run's row, its log
    and artifacts as they are now, and its figures (``show_kept``: kept for an ended
    run, computed for one that runs or changed)."""
    run = store.run(run_id)
    figures = show_figures(store, run)
    summary = figures["steps"]
    art_list = [
        {"kind": a["kind"], "path": a["path"], "rank": int(a["rank"]),
         "created_at": a["created_at"]}
        for a in store.artifact_rows(run_id)
    ]  # fmt: skip
    out: dict[str, Any] = {
        "id": int(run["id"]),
        "name": run["name"],
        "status": run["status"],
        "exit_code": run["exit_code"],
        "error": run["error"],
        "stop_reason": run["stop_reason"],
        "command": run["command"],
        "cwd": run["cwd"],
        "host": run["host"],
        "started_at": run["started_at"],
        "ended_at": run["ended_at"],
        "duration_s": run_duration(run),
        "max_steps": run["max_steps"],
        "parent_run_id": run["parent_run_id"],
        "run_dir": str(store.home / "runs" / str(run_id)),
        "device": run["device"],
        "env": run["env"],
        "config": run["config"],
        "facts": run["facts"],
    }
    out.update(summary)
    out["generation"] = figures["generation"]
    if out["generation"] is not None:
        out["latency"] = None  # per-forward figures of a generation run: never (docstring)
    out["warmup"] = {"steps": summary["warmup_steps"], "time_s": summary["warmup_time_s"]}
    out["artifacts"] = [a["path"] for a in art_list]
    out["artifact_details"] = art_list
    out["samples"] = figures["samples"]
    out["events"] = [
        {
            "t": e["t"],
            "rank": None if e["rank"] is None else int(e["rank"]),
            "level": e["level"],
            "source": e["source"],
            "message": e["message"],
        }
        for e in store.event_rows(run_id)
    ]
    out["memory"] = with_lines(figures["memory"])
    return out


def diagnosis_summary(store: Any, run_id: int) -> dict[str, Any] | None:
    """``{"level", "reason", "findings", "verdict", "error"}``; None for a running run never
    diagnosed."""
    try:
        diagnosis = saved_diagnosis(store, run_id)
    except Exception as exc:  # the summary is shown all the same
        error = f"diagnosis failed: {one_line_error(type(exc), exc)}"
        return {"level": None, "reason": None, "findings": [], "verdict": [error], "error": error}
    if diagnosis is None:
        return None
    return {
        "level": diagnosis.level,
        "reason": diagnosis.reason,
        "findings": diagnosis.to_json(),
        "verdict": verdict_lines(run_id, diagnosis, more="analyze"),
        "error": None,
    }


def cmd_show(ref: str, as_json: bool) -> int:
    with RunStore() as store:
        run_id = store.resolve_run(ref)
        diagnosis = diagnosis_summary(store, run_id)  # first: it may save a diagnosis
        data = run_summary(store, run_id)
    data["diagnosis"] = diagnosis
    if as_json:
        print_json(data)
        return 0
    _print_show(data)
    return 0


def _print_show(d: dict[str, Any]) -> None:
    console = term.console()
    head = term.table(
        show_header=False, title=f"run {d['id']}: {esc(d['name'])}", title_justify="left"
    )
    head.add_column(style="bold")
    head.add_column()
    head.add_row("status", status_text(d["status"]))
    head.add_row("command", esc(" ".join(d["command"])) if isinstance(d["command"], list) else "")
    if d["exit_code"] is not None:
        head.add_row("exit code", str(d["exit_code"]))
    if d["error"]:
        head.add_row("error", esc(d["error"]))
    if d["stop_reason"]:
        head.add_row("stop reason", esc(d["stop_reason"]))
    limit = (d["config"] or {}).get("memory_limit")
    if limit:
        head.add_row("memory limit", f"{fmt_bytes(limit)} ({int(limit)} bytes, RLIMIT_AS)")
    head.add_row("started", fmt_time(d["started_at"]))
    head.add_row("duration", fmt_s(d["duration_s"], digits=1))
    if d["device"]:
        device = ", ".join(f"{k}={fmt_value(v)}" for k, v in d["device"].items())
        head.add_row("device", esc(device))
    head.add_row("folder", esc(d["run_dir"]))
    console.print(head)
    if d.get("diagnosis"):
        console.print("\n".join(esc(line) for line in d["diagnosis"]["verdict"]))
    _print_applied(console, d["config"])

    gen = d["generation"]
    title = "steps (one per request)" if gen and d["steps"] == gen["requests"] else "steps"
    st = term.table(show_header=False, title=title, title_justify="left")
    st.add_column(style="bold")
    st.add_column(justify="right")
    st.add_row("steps", steps_recorded(d))
    left_out = d.get("left_out") or {}
    warmup = left_out.get("warmup", d["warmup_steps"])
    st.add_row("warm-up (excluded)", f"{warmup} steps, {fmt_s(d['warmup_time_s'])}")
    profiled = left_out.get("profiled", d["profiled_steps"])
    if profiled:
        st.add_row("profiled (excluded)", str(profiled))
    st.add_row("timed", f"{d['timed_steps']} steps")
    st.add_row("median step time", fmt_s(d["step_time_median_s"]))
    st.add_row("p95 step time", fmt_s(d["step_time_p95_s"]))
    if d["device_step_time_median_s"] is not None:
        st.add_row("median device time", fmt_s(d["device_step_time_median_s"]))
    st.add_row("steps/s", fmt_num(d["steps_per_s"]))
    st.add_row("samples/s", fmt_num(d["samples_per_s"]))
    share = d["data_wait_share"]
    st.add_row("waiting for data", "—" if share is None else f"{fmt_pct(share)} of step time")
    if d["loss_first"] is not None:
        st.add_row("loss first → last", f"{d['loss_first']:.4g} → {d['loss_last']:.4g}")
    console.print(st)
    _print_latency(console, d["latency"])
    _print_generation(console, gen, live=d["status"] == "running")
    print_memory_section(console, d["id"], d.get("memory"))

    metrics = d["samples"]["metrics"]
    shown = [(k, label, kind) for k, label, kind in _SHOWN_SAMPLES if k in metrics]
    gpus = sorted({k.split(".")[0] for k in metrics if k.startswith("gpu")})
    for gpu in gpus:
        shown += [(f"{gpu}.{m}", f"{gpu} {label}", kind) for m, label, kind in _GPU_SHOWN]
    shown = [s for s in shown if s[0] in metrics]
    if shown:
        sm = term.table(title=f"samples ({d['samples']['count']})", title_justify="left")
        sm.add_column("metric")
        sm.add_column("mean", justify="right")
        sm.add_column("max", justify="right")
        for key, label, kind in shown:
            m = metrics[key]
            sm.add_row(label, _fmt_kind(m["mean"], kind), _fmt_kind(m["max"], kind))
        console.print(sm)

    if d["artifact_details"]:
        art = term.table(title="artifacts", title_justify="left")
        art.add_column("kind")
        art.add_column("rank", justify="right")
        art.add_column("path", overflow="fold")
        for a in d["artifact_details"]:
            art.add_row(esc(a["kind"]), str(a["rank"]), esc(a["path"]))
        console.print(art)

    if d["events"]:
        ev = term.table(title="log", title_justify="left")
        ev.add_column("time")
        ev.add_column("level")
        ev.add_column("source")
        ev.add_column("message", overflow="fold")
        for e in d["events"]:
            ev.add_row(
                fmt_time(e["t"], clock=True), esc(e["level"]), esc(e["source"]), esc(e["message"])
            )
        console.print(ev)


def _print_latency(console: Any, lat: dict[str, Any] | None) -> None:
    """An inference run: each step is a request or a batch; its latency distribution.

    Two columns: the whole iteration (the step, data wait included: the basis of
    requests/s) and the model call alone (``analyzers/steps/latency.py`` says why both).
    """
    if lat is None:
        return
    t = term.table(
        title=f"latency (inference: {lat['count']} timed requests or batches)",
        title_justify="left",
    )
    t.add_column("")
    t.add_column("iteration", justify="right")
    t.add_column("model call", justify="right")
    model = lat["model"] or {}
    for key, label in _LATENCY_ROWS:
        t.add_row(label, fmt_s(lat[key]), fmt_s(model.get(key)))
    console.print(t)
    console.print(
        f"requests/s {fmt_num(lat['requests_per_s'])} · samples/s {fmt_num(lat['samples_per_s'])}"
    )


def _print_generation(console: Any, gen: dict[str, Any] | None, live: bool) -> None:
    """A run that served generation requests: its requests and tokens, the latency
    distributions per request (``analyzers/steps/generation.py`` says what each holds), the
    throughput and the prefill / decode / other split of the request time."""
    if gen is None:
        return
    sources = ", ".join(gen["sources"]) or "-"
    t = term.table(show_header=False, title=f"generation ({sources})", title_justify="left")
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_row("requests", f"{gen['requests']} ({gen['timed_requests']} timed)")
    if gen["unfinished"]:
        t.add_row("in flight" if live else "unfinished", str(gen["unfinished"]))
    if gen["failed"]:
        t.add_row("failed", str(gen["failed"]))
    t.add_row("prompt tokens", fmt_num(gen["prompt_tokens"]))
    t.add_row("new tokens", fmt_num(gen["new_tokens"]))
    t.add_row("tokens/s", fmt_num(gen["tokens_per_s"]))
    t.add_row("requests/s", fmt_num(gen["requests_per_s"]))
    phases = gen["phases"] or {}
    t.add_row(
        "prefill / decode / other",
        " / ".join(fmt_pct(phases.get(k), none="-") for k in ("prefill", "decode", "other")),
    )
    kv = kv_cache_line(gen.get("kv_cache"))
    if kv is not None:
        t.add_row("KV cache", esc(kv.removeprefix("KV cache ")))
    console.print(t)
    d = term.table(title=f"per request ({gen['timed_requests']} timed)", title_justify="left")
    d.add_column("")
    for name in ("p50", "p90", "p99", "mean"):
        d.add_column(name, justify="right")
    for key, label in _GENERATION_ROWS:
        figures = gen[key] or {}
        d.add_row(label, *(fmt_s(figures.get(n)) for n in ("p50", "p90", "p99", "mean")))
    console.print(d)


def _print_applied(console: Any, config: dict[str, Any] | None) -> None:
    """A trial run of an experiment: what its fixes changed in the job, as logged."""
    label = trial_label(config)
    changes = applied_changes(config)
    fixes = ", ".join((config or {}).get("fixes") or [])
    if not changes and (label is None or not fixes):
        return  # not a trial, or a baseline trial: nothing was applied
    title = f"fixes applied ({esc(label or 'not a trial')}; fixes: {esc(fixes or '-')})"
    if not changes:
        console.print(f"{title}: the job logged no change")
        return
    t = term.table(title=title, title_justify="left")
    t.add_column("fix")
    t.add_column("change", overflow="fold")
    t.add_column("state")
    for c in changes:
        colour = "green" if c["applied"] and c["verified"] is not False else "yellow"
        t.add_row(esc(c["fix"]), esc(c["change"]), f"[{colour}]{state(c)}[/{colour}]")
    console.print(t)


def _fmt_kind(x: float, kind: str) -> str:
    if kind == "pct":
        return f"{x:.0f}"
    if kind == "bytes":
        return fmt_bytes(x)
    if kind == "rate":
        return fmt_bytes(x) + "/s"
    return f"{x:.3g}"
