"""Generation rules: a run whose steps are requests (``analyzers/steps/generation.py``).

Each rule is a plain ``Evidence -> Finding | None`` over the requests the job made and the
tokens they decoded (``Evidence.requests``, ``timed``, ``tokens``):

* ``no_kv_cache``: each decode step recomputes the whole context, so its time grows with
  the context (slope and fit over the tokens), in a hand-written loop that feeds the
  whole sequence each time or a ``generate(use_cache=False)``. Its share is the time a
  cache would give back, so it ranks by it in full (waste, not work);
* ``decode_batch_one``: requests of one row, decoding with a cache, whose decode is most
  of the request: every decode step reads all the weights for one token (a decode
  without a cache reads them once for the whole context: ``no_kv_cache``'s requests are
  left out). Read against the roof (bytes per
  token over its time, as a share of the host's or the GPU's bandwidth) as evidence of
  the same finding, not as a finding of its own: it is the same decode time, and two
  findings over it would count it twice in the ranking; the roof says which of its
  fixes fits (batching and fewer bytes near the roof, less per-call overhead far below);
* ``long_prefill``: the prompt's forward is a large share of the request.

Why not ``rules.inference.small_batch`` here: its fix is a DataLoader's batch; a
generation job batches prompts in one ``generate()`` call (``--sweep batch``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from stepscope.analyzers.hardware.device_peaks import match_device
from stepscope.analyzers.hardware.roofline import NO_CALIBRATION
from stepscope.analyzers.rules.evidence import Evidence
from stepscope.analyzers.rules.readings import pct
from stepscope.analyzers.rules.thresholds import (
    DECODE_BATCH_WEIGHT,
    DECODE_MIN,
    DECODE_ROOF_NEAR,
    LONG_PREFILL_MIN,
    NO_CACHE_MIN_GROWTH,
    NO_CACHE_MIN_POSITIONS,
    NO_CACHE_MIN_R2,
    NO_CACHE_WEIGHT,
    PRODUCTIVE_WEIGHT,
)
from stepscope.types import EvidenceItem, Finding

SOURCE = "requests"
# Positions fitted at most: a longer profile is binned (median per bin), which keeps
# Theil-Sen's pairwise slopes to ~80 k.
MAX_FIT_POINTS = 400
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1}


@dataclass(frozen=True)
class ContextFit:
    """Decode forward time against the context length (seconds per token of context)."""

    slope: float
    low: float  # 95 % confidence interval of the slope (Theil-Sen)
    high: float
    intercept: float
    r2: float  # of a least-squares line over the undisturbed positions
    first: int  # the first and last positions fitted
    last: int
    points: int  # positions fitted
    disturbed: int  # of them, left out of r² (far above the line: another process ran)

    def at(self, position: float | np.ndarray) -> Any:
        return self.intercept + self.slope * position

    @property
    def growth(self) -> float:
        """The fit at the last position over the fit at the first."""
        start = self.at(self.first)
        return float(self.at(self.last) / start) if start > 0 else float("inf")


def generation_run(ev: Evidence) -> bool:
    return ev.generation is not None and ev.timed is not None and not ev.timed.empty


def context_fit(tokens: pd.DataFrame) -> ContextFit | None:
    """The fit of the forwards' own time on their position; None with fewer than
    ``NO_CACHE_MIN_POSITIONS`` positions.

    Per position, the fastest of the requests' forwards: other work on the machine only
    ever adds time to a forward (a preempted one takes a scheduler slice longer), so the
    least disturbed one is the best estimate of its cost (the rule ``timeit`` follows).
    The slope is Theil-Sen's (robust to the positions where every request was
    disturbed); r² is a least-squares line's over the positions within 3 scaled MADs of
    it, the others counted as disturbed.
    """
    profile = tokens.dropna(subset=["forward_s"]).groupby("position")["forward_s"].min()
    if len(profile) < NO_CACHE_MIN_POSITIONS:
        return None
    # here, not at the top: scipy.stats takes half a second to import, and every CLI
    # command that shows findings imports this module (most runs decode nothing)
    from scipy import stats

    x = profile.index.to_numpy(dtype=float)
    y = profile.to_numpy(dtype=float)
    if len(x) > MAX_FIT_POINTS:
        bins = np.array_split(np.arange(len(x)), MAX_FIT_POINTS)
        x = np.array([np.median(x[b]) for b in bins])
        y = np.array([np.median(y[b]) for b in bins])
    slope, intercept, low, high = stats.theilslopes(y, x, alpha=0.95)
    resid = y - (intercept + slope * x)
    # at least 1 % of the typical forward: points exactly on a line have no spread at all
    spread = max(stats.median_abs_deviation(resid, scale="normal"), 0.01 * np.median(y))
    calm = np.abs(resid - np.median(resid)) <= 3 * spread
    r2 = 0.0
    if calm.sum() >= 3 and np.ptp(y[calm]) > 0 and np.ptp(x[calm]) > 0:
        r2 = float(stats.linregress(x[calm], y[calm]).rvalue ** 2)
    return ContextFit(
        float(slope),
        float(low),
        float(high),
        float(intercept),
        r2,
        int(x.min()),
        int(x.max()),
        len(x),
        int((~calm).sum()),
    )


def _no_cache_requests(ev: Evidence) -> tuple[pd.DataFrame, EvidenceItem | None, float]:
    """The timed requests that may decode without a cache, the evidence that they do and
    the rule's confidence: ``generate(use_cache=False)`` calls (said by the call), and
    hand-written loops (their code line; the loop's mode where the collector recorded
    it, ``meta["kv_cache"]``: a loop that feeds one token with a cache is left out)."""
    timed = ev.timed
    metas = timed["meta"].map(lambda m: m if isinstance(m, dict) else {})
    generate = timed["source"] == "generate"
    off = generate & metas.map(lambda m: m.get("use_cache") is False)
    loop = (timed["source"] == "loop") & ~metas.map(lambda m: m.get("kv_cache") is True)
    picked = timed[off | loop]
    if picked.empty:
        return picked, None, 0.0
    if bool(off.any()):
        calls = int(off.sum())
        text = f"{calls} generate() call{'s' if calls != 1 else ''} with use_cache=False"
        return picked, EvidenceItem.of(text, calls, SOURCE), 0.9
    sites = [m.get("site") for m in metas[loop] if m.get("site")]
    where = max(set(sites), key=sites.count) if sites else "the script"
    text = f"a decode loop that feeds the model the whole sequence each time: {where}"
    confirmed = bool(metas[loop].map(lambda m: m.get("kv_cache") is False).all())
    return picked, EvidenceItem.of(text, None, SOURCE), 0.9 if confirmed else 0.8


def _busy(ev: Evidence) -> float:
    """The timed requests' summed latency (seconds): the time the shares are of."""
    return float(ev.timed["latency_s"].fillna(0).sum())


def no_cache_give_back(ev: Evidence) -> tuple[float, dict[str, Any] | None]:
    """(share of request time a KV cache would give back, the fit, its evidence and the
    requests it holds for) where the no-cache decode shows; (0, None) where it does not."""
    if not generation_run(ev) or ev.tokens is None or ev.tokens.empty:
        return 0.0, None
    picked, signal, confidence = _no_cache_requests(ev)
    if signal is None:
        return 0.0, None
    keys = set(zip(picked["rank"], picked["request"], strict=True))
    tokens = _tokens_of(ev, keys)
    fit = context_fit(tokens)
    if (
        fit is None
        or fit.low <= 0
        or fit.r2 < NO_CACHE_MIN_R2
        or fit.growth < NO_CACHE_MIN_GROWTH
        or _busy(ev) <= 0
    ):
        return 0.0, None
    # with a cache every token costs about what the first position costs
    extra = fit.at(tokens["position"].to_numpy(dtype=float)) - fit.at(fit.first)
    forward = tokens["forward_s"].to_numpy(dtype=float)
    saved = float(np.clip(extra, 0.0, forward).sum())
    share = min(1.0, saved / _busy(ev))
    return share, {
        "fit": fit,
        "signal": signal,
        "confidence": confidence,
        "decode_part": saved / max(float(forward.sum()), 1e-12),
        "requests": keys,
    }


def _tokens_of(ev: Evidence, keys: set[tuple[Any, Any]]) -> pd.DataFrame:
    """The decoded tokens of the requests ``keys`` ((rank, request) pairs)."""
    tokens = ev.tokens
    return tokens[[k in keys for k in zip(tokens["rank"], tokens["request"], strict=True)]]


def no_kv_cache(ev: Evidence) -> Finding | None:
    share, found = no_cache_give_back(ev)
    if found is None or share <= 0:
        return None
    fit: ContextFit = found["fit"]
    us = 1e6
    evidence = [
        EvidenceItem.of(
            f"decode forward time grows {fit.slope * us:.1f} µs per token of context "
            f"(Theil-Sen, 95 % CI {fit.low * us:.1f}-{fit.high * us:.1f}), r² {fit.r2:.2f} "
            f"over {fit.points - fit.disturbed} of {fit.points} positions (the fastest "
            "request's forward at each; the others disturbed by other work)",
            fit.slope * us,
            SOURCE,
        ),
        EvidenceItem.of(
            f"{fit.at(fit.first) * 1e3:.2f} ms per token at position {fit.first}, "
            f"{fit.at(fit.last) * 1e3:.2f} ms at position {fit.last} ({fit.growth:.1f}x)",
            fit.growth,
            SOURCE,
        ),
        found["signal"],
        EvidenceItem.of(
            f"with a KV cache each token would cost about the first position's time: "
            f"{pct(share)} of request time back ({pct(found['decode_part'])} of these "
            "requests' decode)",
            share,
            SOURCE,
        ),
    ]
    return Finding(
        "compute",
        "no_kv_cache",
        f"No KV cache: every new token recomputes the whole context "
        f"(+{fit.slope * us:.0f} µs per token of context)",
        share,
        found["confidence"],
        evidence,
        weight=NO_CACHE_WEIGHT,
        phase="decode",
    )


def decode_roof(ev: Evidence, seconds: float, position: float) -> dict[str, Any] | None:
    """Bytes one decode step reads (the weights, plus the KV cache where the job's facts
    give its bytes per token) over ``seconds``, against the bandwidth: the GPU's datasheet
    on a GPU run, else the host's calibration. None where the model's size is unknown;
    ``fraction`` None where no bandwidth is known (``why`` says so)."""
    model = ev.context.model
    params, size = model.get("parameters"), DTYPE_BYTES.get(str(model.get("param_dtype")))
    if not params or not size or seconds <= 0:
        return None
    weights = float(params) * size
    kv_per_token = model.get("kv_bytes_per_token")
    kv = float(kv_per_token) * position if kv_per_token else None
    read = weights + (kv or 0.0)
    out: dict[str, Any] = {"weights": weights, "kv": kv, "bytes": read, "seconds": seconds}
    out["gbs"] = read / seconds / 1e9
    peak = (
        match_device(ev.context.device_name) if ev.context.cuda and ev.context.device_name else None
    )
    if peak is not None and peak.memory_gbs > 0:
        out.update(peak_gbs=peak.memory_gbs, where=f"the {peak.name}'s", source=peak.source)
    elif ev.context.cuda:
        out.update(peak_gbs=None, why=f"GPU {ev.context.device_name or '?'} not in the peak table")
    elif ev.calibration is not None:
        cal = ev.calibration
        out.update(peak_gbs=cal.bandwidth_gbs, where="this machine's", source=cal.conditions())
    else:
        out.update(peak_gbs=None, why=NO_CALIBRATION)
    out["fraction"] = out["gbs"] / out["peak_gbs"] if out.get("peak_gbs") else None
    return out


def _roof_evidence(roof: dict[str, Any] | None) -> list[EvidenceItem]:
    if roof is None:
        why = "the model's parameters or dtype, or the decode step's time, are unknown"
        return [EvidenceItem.of(f"decode not read against the roof: {why}", None, "job facts")]
    kv = f" + {roof['kv'] / 1e6:.1f} MB of KV cache" if roof["kv"] else " (KV cache not counted)"
    read = (
        f"{roof['weights'] / 1e6:.1f} MB of weights{kv} read per token in "
        f"{roof['seconds'] * 1e3:.2f} ms: {roof['gbs']:.2f} GB/s"
    )
    if roof["fraction"] is None:
        return [EvidenceItem.of(f"{read}; {roof['why']}", roof["gbs"], "job facts")]
    fraction = float(roof["fraction"])
    bound = (
        "bound by reading the weights: fewer bytes per token (batching, 8-/16-bit weights) "
        "are what make it faster"
        if fraction >= DECODE_ROOF_NEAR
        else "far under it: per-call overhead (Python, dispatch, launches) dominates each "
        "token; batching shares it between rows, a compiled static-cache decode cuts it"
    )
    return [
        EvidenceItem.of(
            f"decode at {pct(fraction)} of {roof['where']} bandwidth floor: {read} of "
            f"{roof['peak_gbs']:.1f} GB/s ({roof['source']})",
            fraction,
            "job facts",
        ),
        EvidenceItem.of(bound, None, "stepscope"),
    ]


def decode_batch_one(ev: Evidence) -> Finding | None:
    """Requests of one row that decode with a cache: a decode without one recomputes
    the context (``no_kv_cache``) and reads each weight once for many tokens."""
    if not generation_run(ev):
        return None
    timed, busy = ev.timed, _busy(ev)
    _, no_cache = no_cache_give_back(ev)
    keys = list(zip(timed["rank"], timed["request"], strict=True))
    cached = [k not in (no_cache or {}).get("requests", ()) for k in keys]
    one = timed[(timed["rows"].fillna(1) <= 1).to_numpy() & np.array(cached, dtype=bool)]
    if busy <= 0 or len(one) * 2 < len(timed):
        return None
    share = float(one["decode_s"].fillna(0).sum()) / busy
    if share < DECODE_MIN:
        return None
    tokens = _tokens_of(ev, set(zip(one["rank"], one["request"], strict=True)))
    per_token = float(tokens["forward_s"].median()) if len(tokens) else 0.0
    position = float(tokens["position"].mean()) if len(tokens) else 0.0
    roof = decode_roof(ev, per_token, position)
    tps = (ev.generation or {}).get("tokens_per_s")
    evidence = [
        EvidenceItem.of(
            f"{len(one)} of {len(timed)} timed requests decode one row (batch size 1)",
            len(one) / len(timed),
            SOURCE,
        ),
        EvidenceItem.of(
            f"decode {pct(share)} of request time; {per_token * 1e3:.2f} ms per decode step"
            + (f", {tps:.1f} tokens/s" if tps else ""),
            share,
            SOURCE,
        ),
        *_roof_evidence(roof),
        EvidenceItem.of(
            "each decode step reads every weight for one row's token; B prompts in one "
            "generate() call read them once for B tokens: `stepscope optimize RUN --sweep "
            "batch` measures tokens/s, p99 latency and token agreement per batch size",
            None,
            "stepscope",
        ),
    ]
    title = "Decode at batch size 1: every weight read again for each token"
    if roof is not None and roof["fraction"] is not None:
        title += f" (decode at {pct(float(roof['fraction']))} of the bandwidth floor)"
    return Finding(
        "memory",
        "decode_batch_one",
        title,
        share,
        0.7,
        evidence,
        weight=DECODE_BATCH_WEIGHT,
        phase="decode",
    )


def long_prefill(ev: Evidence) -> Finding | None:
    if not generation_run(ev):
        return None
    timed, busy = ev.timed, _busy(ev)
    prefill = float(timed["prefill_s"].fillna(0).sum()) / busy if busy > 0 else 0.0
    if prefill < LONG_PREFILL_MIN:
        return None
    rows = timed["rows"].fillna(1).clip(lower=1)
    per_row = timed["prompt_tokens"].fillna(0) / rows
    rate = float(timed["prompt_tokens"].fillna(0).sum()) / max(
        float(timed["prefill_s"].fillna(0).sum()), 1e-12
    )
    ttft = ((ev.generation or {}).get("ttft_s") or {}).get("p50")
    evidence = [
        EvidenceItem.of(f"prefill {pct(prefill)} of request time", prefill, SOURCE),
        EvidenceItem.of(
            f"prompts of {per_row.mean():.0f} tokens per row on average "
            f"(longest {per_row.max():.0f}), prefilled at {rate:,.0f} tokens/s",
            float(per_row.mean()),
            SOURCE,
        ),
    ]
    if ttft is not None:
        evidence.append(
            EvidenceItem.of(f"time to first token p50 {ttft * 1e3:.1f} ms", ttft, SOURCE)
        )
    return Finding(
        "compute",
        "long_prefill",
        f"Long prompts: prefill {pct(prefill)} of request time "
        f"({per_row.mean():.0f}-token prompts)",
        prefill,
        0.7,
        evidence,
        weight=PRODUCTIVE_WEIGHT,
        phase="prefill",
    )
