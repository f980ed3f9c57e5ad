"""Requests, tokens and their latencies: the figures of a text-generation run.

The store has one row per request (``collectors/steps/generation.py`` says what a request is)
and, in it, each forward after the prefill (``tokens``: position in the sequence, start
offset from the request's start, seconds). From them:

* **Per request** (``request_table``): latency (start to end of the ``generate()`` call,
  or a loop's first forward to its last: what a script's ``perf_counter`` around the call
  measures), time to first token (TTFT: the prefill and picking its token), time per
  output token after the first (TPOT: the rest of the latency over the rest of the
  positions), tokens/s (new tokens over all rows, over the latency).
* **Per token** (``token_latencies``): the inter-token latency (from one forward's start
  to the next's; the last one to the request's end) and the forward's own time, against
  the position: a decode that re-reads the whole context (no KV cache) grows with it.
* **The run** (``generation_summary``): p50/p90/p99/mean of request latency, TTFT, TPOT;
  tokens/s and requests/s (totals over the summed latency of the timed requests, as a
  closed loop's throughput); prompt and new tokens; the prefill / decode / other split.
* **For the views** (``requests_frame``, ``position_profile``): the per-request table with
  fixed columns (the API's ``requests``, the Run page's table) and, per position, the
  median over requests of the token latencies (the Run page's KV-cache line).

Timed requests are those of the timed steps (``step_stats.timed_steps``: the first one's
lazy set-up and a capture's steps left out), so the figures agree with the step-time
figures; a run too short to have any timed request falls back to all its finished ones.
Unfinished requests (a job killed mid-request: status 'running' in a finished run) and
failed ones are counted, never timed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from stepscope.analyzers.steps.step_stats import timed_steps

STATS = (50, 90, 99)
# The per-request table the API and the dashboard show (``requests_frame``): who, what
# came in and out, and the figures of the module docstring, in seconds.
REQUEST_COLUMNS = [
    "rank",
    "request",
    "step",
    "source",
    "status",
    "rows",
    "prompt_tokens",
    "new_tokens",
    "latency_s",
    "ttft_s",
    "tpot_s",
    "tokens_per_s",
    "prefill_s",
    "decode_s",
    "other_s",
    "kv_cache_bytes",
]
TOKEN_COLUMNS = ["rank", "request", "position", "offset_s", "forward_s", "latency_s"]
POSITION_COLUMNS = ["position", "requests", "latency_s", "forward_s"]


def is_generation(steps: pd.DataFrame) -> bool:
    """A run whose steps are requests (kind 'generate')."""
    return not steps.empty and "kind" in steps and bool((steps["kind"] == "generate").any())


def request_table(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per request with its latency, TTFT, TPOT and tokens/s (NaN where a
    request did not finish)."""
    if requests is None or requests.empty:
        return pd.DataFrame(
            columns=["rank", "request", "step", "status", "latency_s", "ttft_s", "tpot_s"]
        )
    df = requests.copy()
    done = df["status"] == "done"
    df["latency_s"] = (df["end_s"] - df["start_s"]).where(done)
    rest = df["latency_s"] - df["ttft_s"]
    df["tpot_s"] = (rest / (df["positions"] - 1)).where(done & (df["positions"] > 1))
    df["tokens_per_s"] = (df["new_tokens"] / df["latency_s"]).where(df["latency_s"] > 0)
    df["other_s"] = (df["latency_s"] - df["prefill_s"].fillna(0) - df["decode_s"].fillna(0)).clip(
        lower=0.0
    )
    for key in ("kv_cache_bytes", "kv_cache_context"):
        df[key] = pd.to_numeric(df["meta"].map(lambda m, k=key: _meta_number(m, k)), "coerce")
    return df


def _meta_number(meta: Any, key: str) -> float | None:
    """A number the job put in a request's meta (None where absent or not a number: the
    store is shared, its rows are data)."""
    value = meta.get(key) if isinstance(meta, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def kv_cache_figures(table: pd.DataFrame) -> dict[str, Any] | None:
    """The KV cache at its largest (``collectors/steps/kv_cache.py`` measures it at each
    request's end): ``bytes``, the request it was, ``per_token`` (bytes per position of
    context per row: what one more token of any request costs; None for a cache
    allocated whole, ``allocated_whole``: a static cache, a model's own buffers),
    ``peak_bytes`` and ``share`` (that request's peak memory, CUDA's where the job used
    it, else the process's RSS, and the cache's part of it); None where no request had
    a cache measured (a job without one, or recorded before stepscope measured it)."""
    if "kv_cache_bytes" not in table or not table["kv_cache_bytes"].notna().any():
        return None
    row = table.loc[table["kv_cache_bytes"].idxmax()]
    kv = float(row["kv_cache_bytes"])
    rows = int(row["rows"]) if pd.notna(row.get("rows")) and row["rows"] > 0 else 1
    context = int(row["kv_cache_context"]) if pd.notna(row.get("kv_cache_context")) else None
    grows = isinstance(row.get("meta"), dict) and row["meta"].get("kv_cache_grows") is True
    slots = rows * (context or 0) if grows else 0
    peak = row.get("peak_cuda_bytes")
    basis = "cuda"
    if peak is None or pd.isna(peak):
        peak, basis = row.get("peak_rss_bytes"), "rss"
    peak = None if peak is None or pd.isna(peak) or float(peak) <= 0 else float(peak)
    return {
        "bytes": kv,
        "request": int(row["request"]),
        "rows": rows,
        "context": context,
        "per_token": kv / slots if slots > 0 else None,
        "allocated_whole": not grows,
        "peak_bytes": peak,
        "peak_basis": basis if peak is not None else None,
        "share": kv / peak if peak else None,
    }


def timed_requests(requests: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """The finished requests whose steps are timed (all finished ones, if none is)."""
    table = request_table(requests)
    done = table[table["status"] == "done"]
    if steps is None or steps.empty or done.empty:
        return done
    timed = timed_steps(steps)
    keys = set(zip(timed["rank"].astype(int), timed["step"].astype(int), strict=True))
    mask = [
        (int(r), int(s)) in keys if pd.notna(s) else False
        for r, s in zip(done["rank"], done["step"], strict=True)
    ]
    picked = done[mask]
    return picked if not picked.empty else done


def stats(values: pd.Series | np.ndarray) -> dict[str, float] | None:
    """{"p50", "p90", "p99", "mean"} of the finite values, or None."""
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return None
    out = {f"p{q}": float(v) for q, v in zip(STATS, np.percentile(arr, STATS), strict=True)}
    out["mean"] = float(arr.mean())
    return out


def generation_summary(
    requests: pd.DataFrame, steps: pd.DataFrame | None = None
) -> dict[str, Any] | None:
    """The run's generation figures; None for a run with no request.

    ``{"requests", "timed_requests", "unfinished", "failed", "prompt_tokens",
    "new_tokens", "request_s", "ttft_s", "tpot_s", "tokens_per_s", "requests_per_s",
    "phases": {"prefill", "decode", "other"}, "sources", "kv_cache"}``: the ``_s`` entries are
    ``{"p50", "p90", "p99", "mean"}`` in seconds over the timed requests, the counts over
    all requests, the phases shares of the timed requests' summed latency.
    """
    if requests is None or requests.empty:
        return None
    table = request_table(requests)
    timed = timed_requests(requests, steps)
    busy = float(timed["latency_s"].sum()) if not timed.empty else 0.0
    new_timed = float(timed["new_tokens"].fillna(0).sum()) if not timed.empty else 0.0
    phases = None
    if busy > 0:
        prefill = float(timed["prefill_s"].fillna(0).sum())
        decode = float(timed["decode_s"].fillna(0).sum())
        phases = {
            "prefill": prefill / busy,
            "decode": decode / busy,
            "other": max(0.0, busy - prefill - decode) / busy,
        }
    return {
        "requests": int(len(table)),
        "timed_requests": int(len(timed)),
        "unfinished": int((table["status"] == "running").sum()),
        "failed": int((table["status"] == "error").sum()),
        "prompt_tokens": int(table["prompt_tokens"].fillna(0).sum()),
        "new_tokens": int(table["new_tokens"].fillna(0).sum()),
        "rows": int(table["rows"].fillna(1).max()),
        "request_s": stats(timed["latency_s"]) if not timed.empty else None,
        "ttft_s": stats(timed["ttft_s"]) if not timed.empty else None,
        "tpot_s": stats(timed["tpot_s"]) if not timed.empty else None,
        "tokens_per_s": new_timed / busy if busy > 0 else None,
        "requests_per_s": len(timed) / busy if busy > 0 else None,
        "phases": phases,
        "sources": sorted(set(table["source"].dropna())),
        "kv_cache": kv_cache_figures(table),
    }


def token_latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per decoded token of the finished requests: ``rank``, ``request``,
    ``position`` (the context it was computed over), ``offset_s`` (its forward's start,
    from the request's start), ``forward_s`` (the forward's own time) and ``latency_s``
    (the inter-token latency: to the next forward's start, or to the request's end)."""
    columns = TOKEN_COLUMNS
    rows: list[tuple[Any, ...]] = []
    if requests is None or requests.empty:
        return pd.DataFrame(columns=columns)
    for r in requests.itertuples(index=False):
        if r.status != "done" or not r.tokens:
            continue
        end = float(r.end_s - r.start_s)
        tokens = r.tokens
        for i, (position, offset, seconds) in enumerate(tokens):
            nxt = tokens[i + 1][1] if i + 1 < len(tokens) else end
            rows.append((r.rank, r.request, position, offset, seconds, nxt - offset))
    return pd.DataFrame(rows, columns=columns)


def requests_frame(requests: pd.DataFrame | None) -> pd.DataFrame:
    """``request_table`` with exactly ``REQUEST_COLUMNS``, one row per request in order:
    the shape a notebook or a page can rely on (empty, with the columns, for a run with no
    request). Unfinished and failed requests keep their row, with NaN for what they never
    had."""
    if requests is None or requests.empty:
        return pd.DataFrame(columns=REQUEST_COLUMNS)
    return request_table(requests).reindex(columns=REQUEST_COLUMNS).reset_index(drop=True)


def position_profile(tokens: pd.DataFrame) -> pd.DataFrame:
    """Per position (context length): how many requests decoded a token there and the
    median over them of the inter-token latency and of the forward's own time.

    The median, not the mean: one request slowed by a neighbour on the machine must not
    bend the line whose slope says whether the decode re-reads the whole context (no KV
    cache) or not. ``tokens``: ``token_latencies``' frame; ``POSITION_COLUMNS``, by position.
    """
    if tokens is None or tokens.empty:
        return pd.DataFrame(columns=POSITION_COLUMNS)
    grouped = tokens.groupby("position", sort=True)
    out = pd.DataFrame(
        {
            "requests": grouped.size(),
            "latency_s": grouped["latency_s"].median(),
            "forward_s": grouped["forward_s"].median(),
        }
    )
    return out.reset_index()[POSITION_COLUMNS]


__all__ = [
    "POSITION_COLUMNS",
    "REQUEST_COLUMNS",
    "TOKEN_COLUMNS",
    "generation_summary",
    "is_generation",
    "position_profile",
    "request_table",
    "requests_frame",
    "stats",
    "timed_requests",
    "token_latencies",
]
