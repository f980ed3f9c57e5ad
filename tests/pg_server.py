"""A real PostgreSQL server for the tests: Debian's binaries, a temporary data directory,
127.0.0.1 on a free port, started once per session and stopped at its end.

``pg_url`` gives each test a fresh database on it (CREATE DATABASE: the stores of two
tests never meet); ``store_backend`` runs a test once on SQLite and once on PostgreSQL,
with ``$STEPSCOPE_STORE`` set for the test (and for the jobs it starts). Without the
server binaries the PostgreSQL half is skipped with the reason, except under CI
(``CI=true``), where they are a requirement (``.ci/run`` installs them).
Also used by ``bench/store_write.py``, which starts its own server with ``PgServer``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN_GLOB = "/usr/lib/postgresql/*/bin"
SUPERUSER = "postgres"


def find_bindir() -> Path | None:
    """The newest installed server's bin folder (Debian keeps them per version)."""
    found = sorted(Path(p).parent for p in Path("/").glob(BIN_GLOB.lstrip("/") + "/initdb"))
    if found:
        return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One throwaway cluster. As root, the server runs as the ``postgres`` OS user
    (initdb refuses root), and the data directory is handed to that user."""

    def __init__(self, bindir: Path, *, fsync: bool = True) -> None:
        self.bindir = bindir
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="stepscope-pg-"))
        self.base.chmod(0o755)
        self.data = self.base / "data"
        self.sockets = self.base / "sockets"
        self.fsync = fsync
        self._as_root = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self._as_root:
            cmd = ["runuser", "-u", SUPERUSER, "--", *cmd]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {(res.stderr or res.stdout).strip()[-2000:]}")

    def start(self) -> PgServer:
        for d in (self.data, self.sockets):
            d.mkdir()
            if self._as_root:
                shutil.chown(d, SUPERUSER, SUPERUSER)
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                  "--no-sync")  # fmt: skip
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1"
            f" -c unix_socket_directories={self.sockets} -c max_connections=200"
            + ("" if self.fsync else " -c fsync=off -c synchronous_commit=off")
        )
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l",
                  str(self.data / "server.log"), "-w", "-t", "60", "start")  # fmt: skip
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; its URL."""
        import psycopg  # local: a dependency of stepscope, but only this helper needs it here

        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The session's PostgreSQL server (started on first use)."""
    bindir = find_bindir()
    if bindir is None:
        reason = "PostgreSQL server binaries not found (apt-get install postgresql)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    # fsync off: the tests kill clients, never the server or the machine
    server = PgServer(bindir, fsync=False).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """A fresh database on the session's server, for this test alone."""
    return pg_server.create_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test on each backend: $STEPSCOPE_STORE names a fresh PostgreSQL database
    for the second run (the test's jobs inherit it), and is unset for the first."""
    if request.param == "postgresql":
        monkeypatch.setenv("STEPSCOPE_STORE", request.getfixturevalue("pg_url"))
    else:
        monkeypatch.delenv("STEPSCOPE_STORE", raising=False)
    return request.param
