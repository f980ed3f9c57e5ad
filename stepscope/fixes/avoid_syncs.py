"""Remove host-device synchronisations from the loop: advice, a code change."""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Advice, Fix
from stepscope.types import Finding

SNIPPET = (
    "# accumulate on the device, read once per log interval\n"
    "running = running + loss.detach()\n"
    "if step % 100 == 0:\n    print(running.item() / 100)"
)


def _advise(finding: Finding, ev: Any) -> Advice | str:
    """Only the syncs' own time can be won back, unless the finding is the syncs.

    ``ev``: the analyzers' evidence (``sync_time_share()``: host time in synchronising
    calls per step / step time). The snippet lists the operators that synced in this run.
    """
    share = finding.share
    if finding.subtype != "host_device":
        share = ev.sync_time_share()
        if share < 0.01:
            return "no synchronising calls found"
    ops = [e.text for e in finding.evidence if "synchronised" in e.text]
    snippet = None
    if ops:
        snippet = "# synchronised in this run:\n" + "".join(f"#   {t}\n" for t in ops) + SNIPPET
    return Advice(share=share, snippet=snippet)


FIX = Fix(
    id="avoid_syncs",
    title="Remove host-device synchronisations from the loop",
    addresses=("communication/host_device", "compute/host_overhead"),
    requires=("cuda",),
    changes_numerics=False,
    auto=False,
    why=".item(), .cpu(), printing tensors and data-dependent shapes make the host "
    "wait for the GPU, so it cannot queue the next kernels",
    snippet=SNIPPET,
    removes=0.8,
    advise=_advise,
)
