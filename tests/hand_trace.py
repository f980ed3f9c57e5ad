"""Hand-built ``Trace`` objects with known answers.

The HTA-parity tests need inputs where every rule (host wait vs kernel wait, the
30 us threshold, the dropped last step, unions across streams) can be placed on
either side of its boundary; building the columns directly is clearer than
writing JSON and shows exactly which fields the analyses read.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analyzers.trace.columns import CATEGORIES, DEVICE_CATEGORIES
from stepscope.analyzers.trace.load import Trace

US = 1000  # ns

DEVICE = set(DEVICE_CATEGORIES)
CATS = CATEGORIES


def ev(cat, name, ts_us, dur_us, rank=0, stream=-1, corr=-1, tid=1):
    """One complete event; times in microseconds (floats allowed)."""
    return {
        "rank": rank,
        "cat": cat,
        "name": name,
        "ts": int(round(ts_us * US)),
        "dur": int(round(dur_us * US)),
        "stream": stream,
        "correlation": corr,
        "tid": tid,
    }


def launch(name, host_us, dev_us, dur_us, corr, stream=7, rank=0, cat="kernel"):
    """A cudaLaunchKernel at ``host_us`` and its kernel at ``dev_us`` (same correlation)."""
    return [
        ev("cuda_runtime", "cudaLaunchKernel", host_us, 2, rank=rank, corr=corr),
        ev(cat, name, dev_us, dur_us, rank=rank, stream=stream, corr=corr, tid=stream),
    ]


def make_trace(rows: list[dict], memory: pd.DataFrame | None = None, meta=None) -> Trace:
    """A Trace as the loader builds it (same columns and dtypes), steps from ProfilerStep#N."""
    df = pd.DataFrame(rows)
    df["end"] = df["ts"] + df["dur"]
    df = df.sort_values(["rank", "ts"], kind="stable", ignore_index=True)
    events = pd.DataFrame(
        {
            "rank": df["rank"].astype(np.int16),
            "pid": np.where(df["cat"].isin(DEVICE), 0, 100).astype(np.int64),
            "tid": df["tid"].astype(np.int64),
            "cat": pd.Categorical(df["cat"], categories=CATS),
            "name": pd.Categorical(df["name"]),
            "ts": df["ts"].astype(np.int64),
            "dur": df["dur"].astype(np.int64),
            "end": df["end"].astype(np.int64),
            "on_device": df["cat"].isin(DEVICE).to_numpy(),
            "correlation": df["correlation"].astype(np.int64),
            "external_id": np.full(len(df), -1, dtype=np.int64),
            "stream": df["stream"].astype(np.int64),
            "device": np.where(df["cat"].isin(DEVICE), 0, -1).astype(np.int64),
            "blocks_per_sm": np.full(len(df), np.nan, dtype=np.float32),
            "occupancy": np.full(len(df), np.nan, dtype=np.float32),
        }
    )
    ranks = sorted(int(r) for r in events["rank"].unique())
    is_step = df["name"].str.startswith("ProfilerStep#") & (df["cat"] == "user_annotation")
    st = df[is_step]
    if st.empty:
        steps = pd.DataFrame(
            {
                "rank": np.array(ranks, dtype=np.int16),
                "step": -1,
                "start": [int(df.loc[df["rank"] == r, "ts"].min()) for r in ranks],
                "end": [int(df.loc[df["rank"] == r, "end"].max()) for r in ranks],
            }
        )
    else:
        steps = pd.DataFrame(
            {
                "rank": st["rank"].astype(np.int16).to_numpy(),
                "step": st["name"].str.split("#").str[1].astype(np.int64).to_numpy(),
                "start": st["ts"].to_numpy(),
                "end": st["end"].to_numpy(),
            }
        )
    if memory is None:
        memory = pd.DataFrame(
            {
                c: pd.Series(dtype="int64")
                for c in (
                    "rank",
                    "ts",
                    "device_type",
                    "device_id",
                    "bytes",
                    "total_allocated",
                    "total_reserved",
                )
            }
        )
    return Trace(
        events=events,
        memory=memory,
        steps=steps,
        ranks=ranks,
        meta=meta or {r: {} for r in ranks},
        warnings=[],
        has_device=bool(events["on_device"].any()),
    )
