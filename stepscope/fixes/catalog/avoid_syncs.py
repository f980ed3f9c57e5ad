"""Remove host-device synchronisations from the loop: advice, a code change."""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Advice, Fix
from stepscope.fixes.fitting import INFERENCE, TRAINING, fit_by_job, kind_of
from stepscope.types import Finding

SNIPPET = (
    "# accumulate on the device, read once per log interval\n"
    "running = running + loss.detach()\n"
    "if step % 100 == 0:\n    print(running.item() / 100)"
)
# An inference loop has no loss: its syncs read outputs, which can stay on the device.
INFERENCE_SNIPPET = (
    "# keep outputs on the device, copy them once per many batches\n"
    "preds.append(out.argmax(-1))\n"
    "if step % 100 == 0:\n    results.extend(torch.cat(preds).tolist()); preds.clear()"
)
SNIPPETS = {TRAINING: SNIPPET, INFERENCE: INFERENCE_SNIPPET}


def _advise(finding: Finding, ev: Any) -> Advice | str:
    """Only the syncs' own time can be won back, unless the finding is the syncs.

    ``ev``: the analyzers' evidence (``sync_time_share()``: host time in synchronising
    calls per step / step time; ``context``: the job's). The snippet lists the operators
    that synced in this run, above the loop of the job's kind (training or inference).
    """
    share = finding.share
    if finding.subtype != "host_device":
        share = ev.sync_time_share()
        if share < 0.01:
            return "no synchronising calls found"
    ops = [e.text for e in finding.evidence if "synchronised" in e.text]
    snippet = None
    if ops:
        loop = SNIPPETS[kind_of(ev.context)]
        snippet = "# synchronised in this run:\n" + "".join(f"#   {t}\n" for t in ops) + loop
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
    fit=fit_by_job({}, SNIPPETS),
    removes=0.8,
    advise=_advise,
)
