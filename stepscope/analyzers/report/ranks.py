"""The ranks of a job analysed side by side: one worker per trace file, where it is read.

Each worker runs ``rank_analysis.analyze_rank`` on one file and returns that rank's
compact part; ``merge.merge_parts`` makes the report. Where the work runs:

- in this process, one rank after another (``workers=1``, or a single file);
- local worker processes (default: one per core, at most one per file, none for a job
  of a few MB, ``SMALL_JOB_BYTES``): forked, so a
  worker costs a fork, not an interpreter start and the imports, and a script calling
  ``stepscope.analyze`` needs no ``if __name__ == "__main__"`` guard; a parent with
  other threads (the dashboard, a notebook) is never forked (a lock one of them holds
  would stay held in the child): its workers come from a fork server instead;
- a Ray cluster (``ray_address``; ``ray_pool.map_on_ray``), for jobs with more ranks
  than one machine analyses in good time; with traces in S3 each task reads its own.

A file's rank is its ``distributedInfo.rank``, else its position in the sorted list;
when files claim the same rank, every file is numbered by its position instead (as
``trace.load.load_trace`` does), and the files whose number changed are analysed again.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from stepscope.analyzers.report.rank_analysis import RankPart, analyze_rank

DUPLICATE_RANKS = "several files claim the same distributedInfo.rank; ranks are file positions"


#: Below this much trace on disk, the ranks are analysed in this process: a few MB take
#: less time than starting workers (a fork server and its imports: ~1 s from a parent
#: with threads), so the default only spreads work that is worth it.
SMALL_JOB_BYTES = 8 << 20


def default_workers(sources: Sequence[str]) -> int:
    """One per core, at most one per file; one for a small job of local files."""
    local = [Path(s) for s in sources if "://" not in str(s)]
    if len(local) == len(sources) and sum(_size(p) for p in local) < SMALL_JOB_BYTES:
        return 1
    return max(1, min(os.cpu_count() or 1, len(sources)))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # its worker says what is wrong with it


Progress = Callable[[int, int], None]  # (ranks done, ranks in all)


def _run(
    calls: list[tuple], workers: int, ray_address: str | None, progress: Progress | None
) -> list[RankPart]:
    tick = progress or (lambda done, total: None)
    if ray_address:
        # local: Ray is an optional extra, imported only when a cluster is asked for
        from stepscope.analyzers.report.ray_pool import map_on_ray

        return map_on_ray(ray_address, analyze_rank, calls)
    if workers <= 1 or len(calls) <= 1:
        parts = []
        for call in calls:
            parts.append(analyze_rank(*call))
            tick(len(parts), len(calls))
        return parts
    if threading.active_count() == 1:
        context = multiprocessing.get_context("fork")
    else:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([analyze_rank.__module__])
    with ProcessPoolExecutor(max_workers=min(workers, len(calls)), mp_context=context) as pool:
        futures = [pool.submit(analyze_rank, *call) for call in calls]
        for done, _ in enumerate(as_completed(futures), start=1):
            tick(done, len(calls))
        return [f.result() for f in futures]


def map_ranks(
    sources: Sequence[str],
    workers: int | None = None,
    ray_address: str | None = None,
    progress: Progress | None = None,
) -> tuple[list[RankPart], list[str]]:
    """Every file's part, in the files' order, and the warnings about their ranks.

    ``progress(done, total)`` after each rank (local work; a Ray cluster answers at once).
    """
    several = len(sources) > 1
    workers = default_workers(sources) if workers is None else max(1, workers)
    if ray_address:  # a task runs in the cluster's working folder: local paths in full
        sources = [s if "://" in str(s) else str(Path(s).resolve()) for s in sources]
    calls = [(str(s), i, several, False) for i, s in enumerate(sources)]
    parts = _run(calls, workers, ray_address, progress)
    ranks = [p.rank for p in parts]
    if len(set(ranks)) == len(ranks):
        return parts, []
    again = [i for i, p in enumerate(parts) if p.rank != i]
    redone = _run([(str(sources[i]), i, several, True) for i in again], workers, ray_address, None)
    for i, part in zip(again, redone, strict=True):
        parts[i] = part
    return parts, [DUPLICATE_RANKS]
