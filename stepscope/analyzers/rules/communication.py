"""Communication rules: collectives not hidden behind compute, and host-device traffic.

Each rule is a plain function ``Evidence -> Finding | None`` for one subtype of
the taxonomy (docs/architecture.md). Host-device time is the copies plus the syncs, from the trace,
or, for an attached job without one, from the lines its stacks show reading tensors back.
"""

from __future__ import annotations

from stepscope.analyzers.rules.evidence import Evidence
from stepscope.analyzers.rules.readings import gpu_util_trace, has_gpu_trace, pct
from stepscope.analyzers.rules.thresholds import COMM_HIGH, COMM_MIN, GPU_UTIL_BUSY, HOST_DEVICE_MIN
from stepscope.types import EvidenceItem, Finding


def collectives(ev: Evidence) -> Finding | None:
    comm = ev.trace.communication if ev.trace is not None else None
    if not comm or not comm.get("share"):
        return None
    share = float(comm["share"])
    if share < COMM_MIN:
        return None
    evidence = [EvidenceItem.of(f"communication {pct(share)} of step time", share, "trace")]
    overlap = comm.get("overlap")
    if overlap is not None:
        evidence.append(
            EvidenceItem.of(f"overlap with compute {pct(float(overlap))}", float(overlap), "trace")
        )
    skew = comm.get("skew")
    if skew is not None and hasattr(skew, "empty") and not skew.empty and "skew_ns" in skew:
        worst = float(skew["skew_ns"].max())
        evidence.append(
            EvidenceItem.of(f"rank skew up to {worst / 1e6:.1f} ms per step", worst / 1e6, "trace")
        )
    return Finding(
        "communication",
        "collectives",
        "Communication: collectives not hidden behind compute",
        share,
        0.85 if share >= COMM_HIGH else 0.55,
        evidence,
        phase="communication",
    )


def host_device(ev: Evidence) -> Finding | None:
    if not has_gpu_trace(ev):
        return _syncs_from_stacks(ev)
    b = ev.trace.breakdown
    copies = float(b.get("Memcpy", 0) + b.get("Memset", 0))
    syncs = ev.trace.syncs
    sync_share = 0.0
    evidence = []
    if syncs is not None and not syncs.empty:
        sync_share = ev.sync_time_share()
        named = syncs[syncs["op"] != ""].head(3)
        for r in named.itertuples():
            evidence.append(
                EvidenceItem.of(
                    f"{r.op} synchronised ({r.call}) {r.count}×, {r.total_ns / 1e6:.2f} ms",
                    r.total_ns / 1e6,
                    "trace",
                )
            )
        util = gpu_util_trace(ev) or 0.0
        if util >= GPU_UTIL_BUSY:
            # The host waits, but the GPU has queued work meanwhile: no step time lost.
            evidence.append(
                EvidenceItem.of(
                    f"syncs {pct(sync_share)} of host time, not counted: GPU busy {pct(util)}",
                    sync_share,
                    "trace",
                )
            )
            sync_share = 0.0
    share = copies + sync_share
    if share < HOST_DEVICE_MIN:
        return None
    evidence.insert(
        0,
        EvidenceItem.of(
            f"copies and syncs {pct(share)} of step time (memcpy {pct(copies)}, syncs {pct(sync_share)})",
            share,
            "trace",
        ),
    )
    return Finding(
        "communication",
        "host_device",
        "Host-device transfers and synchronisations",
        share,
        0.7,
        evidence,
        phase="sync",
    )


def _syncs_from_stacks(ev: Evidence) -> Finding | None:
    """An attached job: the main thread sampled on lines that read tensors back."""
    if ev.stacks is None:
        return None
    share = float(ev.stacks["shares"]["sync"])
    if share < HOST_DEVICE_MIN:
        return None
    evidence = [
        EvidenceItem.of(
            f"main thread waiting on syncs {pct(share)} of the time", share, "stack samples"
        )
    ]
    for s in ev.stacks["sites"]:
        if s["category"] == "sync":
            evidence.append(
                EvidenceItem.of(f"{s['site']}: {pct(s['share'])}", s["share"], "stack samples")
            )
    return Finding(
        "communication",
        "host_device",
        "Host-device synchronisations in the loop (.item(), .cpu(), synchronize)",
        share,
        0.6,
        evidence,
        phase="sync",
    )
