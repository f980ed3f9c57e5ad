"""One run for a multi-node job: its launchers (members) and its ranks.

Each node of a multi-node job starts its own ``stepscope run``; they agree on a
``run_group`` key and all record into one run. The first launcher creates the run, the
others join it (``join_or_create_run``: a unique index on the group's running run makes
a race end in one run on both backends), each adds itself as a member, and the last
member to finish finalises the run with the worst of their statuses.
A part of ``RunStore`` (see ``store.py``), called on the store itself.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stepscope.store.db import integrity_errors, q
from stepscope.store.identity import current_user
from stepscope.store.runs import lock_run

if TYPE_CHECKING:
    import pandas as pd

    from stepscope.store.db import Connection, Db

#: Worst first: the run of several members ends with the worst status among them.
STATUS_SEVERITY = ("failed", "lost", "killed", "interrupted", "stopped", "completed")
_JOIN_ATTEMPTS = 10


class MembersTable:
    """Members (launchers) and ranks of a run."""

    _db: Db

    if TYPE_CHECKING:  # from RunsTable, the part beside this one in RunStore

        def create_run(self, command: Sequence[str], **kwargs: Any) -> int: ...

        def finish_run(
            self, run_id: int, status: str, exit_code: int | None = None, error: str | None = None
        ) -> None: ...

    def join_or_create_run(
        self, command: Sequence[str], *, run_group: str, **create_kwargs: Any
    ) -> tuple[int, bool]:
        """The running run of ``run_group`` (created=False), or a new one (created=True).

        Two launchers racing both try to insert; the partial unique index on the
        group's running run lets one through, and the other finds that run and joins.
        """
        for _ in range(_JOIN_ATTEMPTS):
            found = self._db.scalar(
                "SELECT id FROM runs WHERE run_group=:g AND status='running' ORDER BY id LIMIT 1",
                g=run_group,
            )
            if found is not None:
                return int(found), False
            try:
                return self.create_run(command, run_group=run_group, **create_kwargs), True
            except integrity_errors():
                continue  # another launcher created it first: join that one
        raise RuntimeError(f"could not join or create the run of group {run_group!r}")

    def add_member(
        self,
        run_id: int,
        *,
        host: str | None = None,
        pid: int | None = None,
        pid_started_at: float | None = None,
        node_rank: int | None = None,
    ) -> int:
        """Record a launcher of the run (one per node); returns the member id."""
        with self._db.begin() as conn:
            member = q(
                conn,
                'INSERT INTO run_members(run_id, host, "user", pid, pid_started_at, node_rank,'
                " status, started_at) VALUES (:run_id, :host, :user, :pid, :pid_started_at,"
                " :node_rank, 'running', :t) RETURNING id",
                {
                    "run_id": run_id,
                    "host": host or socket.gethostname(),
                    "user": current_user(),
                    "pid": pid,
                    "pid_started_at": pid_started_at,
                    "node_rank": node_rank,
                    "t": time.time(),
                },
            ).scalar_one()
        return int(member)

    def finish_member(
        self,
        member_id: int,
        status: str,
        exit_code: int | None = None,
        error: str | None = None,
    ) -> bool:
        """Finish one member; True when it was the last running one, in which case the
        run is finalised with the worst status among its members and the first non-zero
        exit code (the first error recorded, if no member gave its own)."""
        with self._db.begin() as conn:
            run_id = q(
                conn, "SELECT run_id FROM run_members WHERE id=:id", {"id": member_id}
            ).scalar()
            if run_id is None:
                raise LookupError(f"no run member with id {member_id}")
            lock_run(conn, run_id)  # members on several hosts may finish at once
            changed = q(
                conn,
                "UPDATE run_members SET status=:status, exit_code=:exit_code, error=:error,"
                " ended_at=:t WHERE id=:id AND status='running'",
                {
                    "status": status,
                    "exit_code": exit_code,
                    "error": error,
                    "t": time.time(),
                    "id": member_id,
                },
            ).rowcount
            members = q(
                conn,
                "SELECT status, exit_code, error FROM run_members WHERE run_id=:r"
                " ORDER BY ended_at, id",
                {"r": run_id},
            ).all()
        if not changed or any(m.status == "running" for m in members):
            return False
        worst = min(
            (m.status for m in members),
            key=lambda s: STATUS_SEVERITY.index(s) if s in STATUS_SEVERITY else 0,
        )
        codes = [m.exit_code for m in members]
        code = next((c for c in codes if c), next((c for c in codes if c is not None), None))
        first_error = next((m.error for m in members if m.error), None)
        self.finish_run(int(run_id), worst, exit_code=code, error=first_error)
        return True

    def members(self, run_id: int) -> pd.DataFrame:
        """The run's launchers, in the order they joined."""
        return self._db.frame("SELECT * FROM run_members WHERE run_id=:r ORDER BY id", r=run_id)

    def register_rank(
        self,
        run_id: int,
        rank: int,
        host: str,
        pid: int | None,
        *,
        conn: Connection | None = None,
    ) -> None:
        """Record (or replace: a restarted rank) which process on which host is ``rank``;
        ``conn``: a transaction already open that the row joins."""
        self._db.execute(
            "INSERT INTO run_ranks(run_id, rank, host, pid, started_at)"
            " VALUES (:r, :rank, :host, :pid, :t) ON CONFLICT(run_id, rank) DO UPDATE"
            " SET host=excluded.host, pid=excluded.pid, started_at=excluded.started_at",
            {"r": run_id, "rank": rank, "host": host, "pid": pid, "t": time.time()},
            conn=conn,
        )

    def ranks(self, run_id: int) -> pd.DataFrame:
        """The run's ranks: where each one ran."""
        return self._db.frame("SELECT * FROM run_ranks WHERE run_id=:r ORDER BY rank", r=run_id)
