"""Where an attached job's main thread spends its time, from Python stack samples.

An attached process has no step timer and no trace, but py-spy's stack samples
(``collectors/samplers/stack_sampler.py``) say what its main thread was doing at each tick.
Each sample goes to one phase of a training step, by the frames on its stack:

- ``data_loading``: inside the DataLoader's iterator, a ``__getitem__`` or a collate;
- ``sync``: the innermost line of the job's own code reads a tensor back to the host
  (``.item()``, ``.cpu()``, ``.tolist()``, ``.numpy()``, ``torch.cuda.synchronize``);
- ``backward``: under ``Tensor.backward`` / ``torch.autograd``;
- ``optimizer``: under ``torch.optim`` (the step, its hooks, the LR scheduler);
- ``forward``: under a module call (``Module._call_impl``) or a compiled frame;
- ``idle``: the innermost frame waits for work: a server's ``select`` under
  ``serve_forever``, an ``accept``, a queue's ``get``, a lock or event's ``wait``, an
  event loop's poll (an inference server attached to between requests is idle, not
  "elsewhere": 77 % of one such attach read as work done outside the model);
- ``elsewhere``: anything else (logging, evaluation, checkpointing, sleeping).

The shares the diagnosis reads (``stack_summary``) are of the busy samples, idle left
out, with the idle share beside them: what a server does while it works is the question,
not how often it is asked.

Order matters where phases nest: data loading wins over everything (a collate calls
tensor methods), and a sync line wins over the phase it sits in. Only the main threads
of the processes that train (or infer) count: DataLoader workers run ``_worker_loop``
and a launcher (torchrun's agent) never enters a phase, so both are left out.
"""

from __future__ import annotations

import linecache
import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

CATEGORIES = ("data_loading", "forward", "backward", "optimizer", "sync", "elsewhere", "idle")
LABELS = {
    "data_loading": "data loading",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer step",
    "sync": "host-device syncs",
    "elsewhere": "elsewhere",
    "idle": "idle (waiting for work)",
}
# (file, function) of an innermost frame that waits for work; the function's last name
# (py-spy writes qualified names: ``EpollSelector.select``, ``Condition.wait``)
_IDLE_WAITS = {
    ("selectors.py", "select"),
    ("socketserver.py", "serve_forever"),
    ("socket.py", "accept"),
    ("queue.py", "get"),
    ("threading.py", "wait"),
    ("threading.py", "_wait_for_tstate_lock"),
    ("base_events.py", "_run_once"),
    ("connection.py", "wait"),
    ("connection.py", "_poll"),
}
STEP_PHASES = ("data_loading", "forward", "backward", "optimizer", "sync")

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*):(?P<line>\d+)\)$")
_SYNC_CALL = re.compile(r"\.(item|cpu|tolist|numpy)\(\)|cuda\.synchronize\(|\.synchronize\(\)")
_WORKER_LOOP = "torch/utils/data/_utils/worker.py"
_DDP_FILE = "torch/nn/parallel/distributed.py"
_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python3")


@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int

    @property
    def short(self) -> str:
        return f"{self.func} ({self.file.rsplit('/', 1)[-1]}:{self.line})"


def parse_frames(frames: str) -> list[Frame]:
    """'func (file:line);...' as stored, outermost first; unparseable frames are kept
    with an empty file (py-spy writes '<unknown>' frames for native code)."""
    out = []
    for text in frames.split(";"):
        m = _FRAME.match(text)
        if m:
            out.append(Frame(m["func"], m["file"], int(m["line"])))
        elif text:
            out.append(Frame(text, "", 0))
    return out


def _is_library(frame: Frame) -> bool:
    return not frame.file or any(part in frame.file for part in _LIBRARY_PARTS)


def _source_line(frame: Frame) -> str:
    """The job's own source line (the attached process runs on this machine)."""
    return linecache.getline(frame.file, frame.line) if frame.file else ""


def classify(frames: list[Frame]) -> str:
    """The step phase of one main-thread sample (see the module docstring)."""
    files = [f.file for f in frames]
    funcs = [f.func for f in frames]
    if any("torch/utils/data/" in f for f in files) or any(
        fn.endswith(("__getitem__", "__getitems__")) or "collate" in fn for fn in funcs
    ):
        return "data_loading"
    if frames and _is_idle(frames[-1]):
        return "idle"
    innermost_own = next((f for f in reversed(frames) if not _is_library(f)), None)
    if frames and frames[-1] is innermost_own and _SYNC_CALL.search(_source_line(innermost_own)):
        return "sync"
    if any("torch/cuda/" in f.file and f.func.endswith("synchronize") for f in frames):
        return "sync"
    if any(
        (f.file.endswith("torch/_tensor.py") and f.func.endswith("backward"))
        or "torch/autograd/" in f.file
        for f in frames
    ):
        return "backward"
    if any("torch/optim/" in f for f in files):
        return "optimizer"
    if any(
        (f.file.endswith("torch/nn/modules/module.py") and "_call_impl" in f.func)
        or "torch/_dynamo/" in f.file
        for f in frames
    ):
        return "forward"
    return "elsewhere"


def _is_idle(frame: Frame) -> bool:
    """The frame waits for work (``_IDLE_WAITS``)."""
    name = frame.file.rsplit("/", 1)[-1]
    return (name, frame.func.rsplit(".", 1)[-1]) in _IDLE_WAITS


def site(frames: list[Frame]) -> str:
    """Where in the job's own code the sample is: its innermost frame outside libraries."""
    own = [f for f in frames if not _is_library(f)]
    pick = own[-1] if own else (frames[-1] if frames else None)
    return pick.short if pick else "(no Python frame)"


def classify_samples(samples: pd.DataFrame) -> pd.DataFrame:
    """The stored stack samples of the main threads that train, each with its phase.

    Columns added: ``category``, ``site``; rows of other threads and of processes that
    are not training (DataLoader workers, launchers) are dropped.
    """
    if samples.empty:
        return samples.assign(category=pd.Series(dtype=str), site=pd.Series(dtype=str))
    main = samples[(samples["tid"] == samples["pid"]) | (samples["thread"] == "MainThread")]
    parsed = {frames: parse_frames(frames) for frames in main["frames"].unique()}
    main = main.assign(
        category=main["frames"].map(lambda s: classify(parsed[s])),
        site=main["frames"].map(lambda s: site(parsed[s])),
        worker=main["frames"].map(lambda s: _WORKER_LOOP in s),
    )
    per_pid = main.groupby("pid").agg(
        worker=("worker", "any"),
        phases=("category", lambda c: bool(set(c) & set(STEP_PHASES))),
    )
    training = per_pid[~per_pid["worker"] & per_pid["phases"]].index
    if len(training) == 0:  # nothing recognisable: the process attached to, as it is
        training = per_pid[~per_pid["worker"]].index[:1]
    return main[main["pid"].isin(training)].drop(columns="worker")


def phase_shares(classified: pd.DataFrame) -> pd.DataFrame:
    """Share of main-thread samples per phase, averaged over the training processes
    (ranks), in CATEGORIES order; columns ``category``, ``label``, ``samples``, ``share``."""
    if classified.empty:
        return pd.DataFrame(columns=["category", "label", "samples", "share"])
    counts = classified.groupby(["pid", "category"])["samples"].sum().unstack(fill_value=0)
    counts = counts.reindex(columns=list(CATEGORIES), fill_value=0)
    shares = counts.div(counts.sum(axis=1), axis=0).mean(axis=0)
    return pd.DataFrame(
        {
            "category": list(CATEGORIES),
            "label": [LABELS[c] for c in CATEGORIES],
            "samples": [int(counts[c].sum()) for c in CATEGORIES],
            "share": [float(shares[c]) for c in CATEGORIES],
        }
    )


def top_sites(classified: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The job's own lines that collect the most samples, with their phase."""
    if classified.empty:
        return pd.DataFrame(columns=["site", "category", "samples", "share"])
    total = classified["samples"].sum()
    sites = (
        classified.groupby(["site", "category"], as_index=False)["samples"]
        .sum()
        .sort_values("samples", ascending=False)
        .head(n)
    )
    return sites.assign(share=sites["samples"] / total).reset_index(drop=True)


def shares_over_time(classified: pd.DataFrame) -> pd.DataFrame:
    """Phase shares per sampling window (for a timeline); columns t, category, share."""
    if classified.empty:
        return pd.DataFrame(columns=["t", "category", "share"])
    per = classified.groupby(["t_start", "category"])["samples"].sum().unstack(fill_value=0)
    per = per.div(per.sum(axis=1), axis=0).reset_index()
    long = per.melt(id_vars="t_start", var_name="category", value_name="share")
    return long.rename(columns={"t_start": "t"})


def stack_summary(samples: pd.DataFrame) -> dict[str, Any] | None:
    """What the diagnosis reads: phase shares, sample and process counts, top sites."""
    classified = classify_samples(samples)
    if classified.empty:
        return None
    counts = classified.groupby("category")["samples"].sum()
    busy = classified[classified["category"] != "idle"]
    shares = phase_shares(busy)  # of the busy samples: what the work is made of
    return {
        "shares": dict.fromkeys(CATEGORIES, 0.0)
        | dict(zip(shares["category"], shares["share"], strict=True)),
        "idle_share": float(counts.get("idle", 0) / counts.sum()),
        # DDP's all-reduce runs in C++ during backward: the stacks cannot show it apart
        "ddp": bool(classified["frames"].str.contains(_DDP_FILE, regex=False).any()),
        "samples": int(classified["samples"].sum()),
        "processes": int(classified["pid"].nunique()),
        "duration_s": float(samples["t_end"].max() - samples["t_start"].min()),
        "sites": top_sites(classified, 5).to_dict("records"),
    }
