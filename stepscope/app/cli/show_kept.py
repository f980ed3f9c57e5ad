"""The figures `stepscope show` prints of a run, kept in the store once the run has ended.

`show` prints a run's step figures, requests, samples and memory breakdown
(``show_figures.compute_figures``). Computed at every `show`, they cost pandas' import
and a read of every record (0.9 s on a 2-core VM, where the issue asks for 0.3 s). They
change only while the run gets records, so those of an ended run are kept
(``store/details.py``), as the runs list keeps its figures (``analyzers/steps/
run_figures.py``), with the state of the run they were computed for: its status and
end, and how many steps, samples, requests and artifacts it had (the artifacts' newest
id too: a capture added to an ended run). A run whose state differs, a run never shown,
and figures kept by another ``DETAILS_VERSION`` are computed again, and kept. A running
run's are computed at every `show`: they change.

Not kept: figures with a memory ``problem`` (a capture's file missing or unreadable:
the file may come back), and anything of a store this user cannot write (computed at
every `show` instead). Read at every `show`, never kept: the run's row, its artifacts,
its log and its diagnosis (which ``saved_diagnosis`` keeps in the run's findings). The
wording is never kept either: the memory lines are worded from the kept breakdown.

`stepscope run` keeps a run's figures as it ends, after the verdict
(``keep_show_figures``), so the first `show` of a run reads them too.
"""

from __future__ import annotations

import json
from typing import Any

from stepscope.store import RunStore
from stepscope.store.db import db_errors
from stepscope.store.url import StoreError

#: how the kept figures were computed: raise it when ``compute_figures`` (or what it
#: calls: ``summarize_steps``, ``generation_summary``, ``samples_summary``,
#: ``memory_breakdown``) computes a figure another way, or gives another shape, and every
#: kept row is computed again once (``tests/test_show_kept.py`` pins it)
DETAILS_VERSION = 1

#: the parts of the figures, and the type each must have in a kept row
PARTS = {"steps": dict, "generation": (dict, type(None)), "samples": dict, "memory": (dict, type(None))}  # fmt: skip


def show_figures(store: Any, run: dict[str, Any]) -> dict[str, Any]:
    """``compute_figures``' dict for ``run`` (``store.run``'s row): kept where the run is
    as it was when they were computed, computed (and kept, for an ended run) otherwise."""
    run_id = int(run["id"])
    ended = run["status"] != "running"
    state = run_state(store, run)
    if ended:
        kept = store.kept_details(run_id)
        if kept is not None and kept[:2] == (state, DETAILS_VERSION) and _shaped(kept[2]):
            return kept[2]
    # local: pandas and the trace analyzers (0.6 s), for figures not kept only
    from stepscope.app.cli.show_figures import compute_figures

    figures = compute_figures(store, run_id)
    if ended and not (figures["memory"] or {}).get("problems"):
        _keep(store, run_id, state, figures)  # keyed by the state read before: conservative
    return figures


def keep_show_figures(run_id: int, home: Any = None) -> None:
    """Compute and keep an ended run's figures now (`stepscope run`, once the verdict is
    printed), unless they are kept already. Never raises: the job's exit code is the
    launcher's answer, and a `show` computes what was not kept."""
    try:
        with RunStore(home) as store:
            run = store.run(run_id)
            if run["status"] != "running":  # one node of a multi-node run: not ended
                show_figures(store, run)
    except Exception:  # the figures are only a head start for the next `show`
        pass


def run_state(store: Any, run: dict[str, Any]) -> str:
    """What of the run decides whether figures kept for it hold, as one text."""
    state = {"status": run["status"], "ended_at": run["ended_at"]}
    return json.dumps({**state, **store.record_state(int(run["id"]))}, sort_keys=True)


def _shaped(figures: dict[str, Any]) -> bool:
    """A kept row has the parts ``compute_figures`` gives, each of its type (a shared
    store is anyone's to write: a row that is not is computed again, never shown)."""
    return set(figures) == set(PARTS) and all(
        isinstance(figures[name], kind) for name, kind in PARTS.items()
    )


def _keep(store: Any, run_id: int, state: str, figures: dict[str, Any]) -> None:
    """Keep what was computed; a store this user cannot write (a read-only file, a server
    role without INSERT) is shown all the same, its figures computed again next time."""
    try:
        store.keep_details(run_id, state, DETAILS_VERSION, figures)
    except (StoreError, ValueError, *db_errors()):
        pass
