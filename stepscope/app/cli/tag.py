"""`stepscope tag RUN NAME`, `tag --list`, `tag --delete NAME`: names for runs.

A tag is what a CI job checks against (``stepscope check last --against main-baseline``)
while the main branch's job moves it to its newest run; the store keeps it
(``store/tags.py``), PostgreSQL included, so every host of a team sees one baseline.
Moving a tag says from which run to which: a baseline that changes under a pipeline
should never do so silently. Unknown runs and tags, and names a tag cannot have, get one
line and exit 2, as `check` does for them.
"""

from __future__ import annotations

import sys

from stepscope.app.cli import term
from stepscope.app.cli.exit_codes import EXIT_UNKNOWN_RUN
from stepscope.app.cli.term import esc, print_json, say
from stepscope.app.formats import fmt_time
from stepscope.store import RunNotFound, RunStore, StoreError
from stepscope.store.tags import TagError


def cmd_tag(
    run: str | None = None,
    name: str | None = None,
    *,
    list_tags: bool = False,
    delete: str | None = None,
    as_json: bool = False,
) -> int:
    if (list_tags or delete is not None) and run is not None:
        print("stepscope tag: --list and --delete take no RUN NAME", file=sys.stderr)
        return 2
    if not (list_tags or delete is not None) and (run is None or name is None):
        print("stepscope tag: give RUN NAME (stepscope tag last main-baseline)", file=sys.stderr)
        return 2
    try:
        with RunStore() as store:
            if list_tags:
                return _list(store, as_json)
            if delete is not None:
                was = store.delete_tag(delete)
                print(f"tag {delete.strip()} deleted (it was on run {was})")
                return 0
            run_id = store.resolve_run(str(run))
            before = store.set_tag(str(name), run_id)
            run_name = store.run(run_id)["name"]
    except RunNotFound as exc:  # as for every command that takes a run
        print(f"stepscope tag: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN_RUN
    except (StoreError, TagError) as exc:
        print(f"stepscope tag: {exc}", file=sys.stderr)
        return 2
    tag = str(name).strip()
    if before is None:
        print(f"tag {tag}: run {run_id} '{run_name}'")
    elif before == run_id:
        print(f"tag {tag}: run {run_id} '{run_name}' (already there)")
    else:
        print(f"tag {tag}: run {before} -> run {run_id} '{run_name}'")
    return 0


def _list(store: RunStore, as_json: bool) -> int:
    rows = store.tag_rows()
    if as_json:
        print_json(rows)
        return 0
    con = term.console()
    if not rows:
        say(con, f"no tags in {store.where}: stepscope tag RUN NAME sets one")
        return 0
    table = term.table(title=f"tags in {esc(store.where)}", title_justify="left")
    for col in ("tag", "run", "run name", "set", "by"):
        table.add_column(col, justify="right" if col == "run" else "left", no_wrap=True)
    for r in rows:
        by = "@".join(str(x) for x in (r["user"], r["host"]) if x)
        table.add_row(
            esc(r["name"]),
            str(int(r["run_id"])),
            esc(r["run_name"]),
            fmt_time(r["created_at"], short=True),
            esc(by),
        )
    con.print(table)
    return 0


__all__ = ["cmd_tag"]
