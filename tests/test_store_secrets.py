"""A store URL's password is never printed, shown or recorded (issue 36, item 6): not
with a raw ``/``, ``?``, ``#``, ``@`` or ``:`` in it, nor percent-encoded.

``split_url`` reads the password without SQLAlchemy (resolving a URL runs in every job
process); it is checked against SQLAlchemy's own parse and rendering for many passwords,
and end to end on a real PostgreSQL server that asks for the password (scram), so a
password the parser cut wrong could not connect.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
from pg_server import PgServer
from sqlalchemy.engine import make_url
from streamlit.testing.v1 import AppTest

from stepscope.app.cli.dashboard import ENTRY
from stepscope.collectors.facts.env_summary import env_summary
from stepscope.store import RunStore, StoreError, redacted, resolve_store_url
from stepscope.store.artifacts import s3_error
from stepscope.store.url import hide_password, split_url

# each holds two fragments a leak would show: "Lx7k" before the character, "Wq3z" after
SPECIALS = ["/", "?", "#", "@", "%40", ":", "/?#@:", "@@", "%", "+"]
PASSWORDS = [f"Lx7k{c}Wq3z" for c in SPECIALS]
MORE = ["s3cret", "/", ":", "a/b?c#d@e:f", "p@h/db?x=", "a%zz", "100%", "a+b c", "é€", "a%2Fb"]
RESTS = ["db.example:5433/runs", "h/db?sslmode=require", "[::1]:5432/db", "h/d%40b"]


def _sqlalchemy_display(url: str) -> str:
    return (
        make_url(url)
        .render_as_string(hide_password=True)
        .replace("postgresql+psycopg://", "postgresql://", 1)
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once released


def _leaks(text: str) -> list[str]:
    return [f for f in ("Lx7k", "Wq3z") if f in text]


# -- the parser against SQLAlchemy ---------------------------------------------------------
@pytest.mark.parametrize("password", PASSWORDS + MORE)
@pytest.mark.parametrize("rest", RESTS)
def test_the_parser_agrees_with_sqlalchemy(password: str, rest: str) -> None:
    url = f"postgresql://ann:{password}@{rest}"
    resolved = resolve_store_url("/nowhere", url)
    engine_url = make_url(resolved.sqlalchemy)
    # the engine gets the password as written (decoded as SQLAlchemy decodes it) ...
    assert engine_url.password == unquote(password)
    assert engine_url.username == "ann"
    # ... and the display is what SQLAlchemy shows for it, password hidden
    assert resolved.display == redacted(url) == _sqlalchemy_display(resolved.sqlalchemy)
    assert resolved.display.startswith("postgresql://ann:***@")
    assert not _leaks(resolved.display)
    if "@" not in password:  # where SQLAlchemy can read the raw URL, it reads it the same
        raw = url.replace("postgresql://", "postgresql+psycopg://", 1)
        assert (make_url(raw).host, make_url(raw).port, make_url(raw).database) == (
            engine_url.host,
            engine_url.port,
            engine_url.database,
        )
        assert _sqlalchemy_display(raw) == resolved.display


def test_a_raw_at_sign_hides_the_whole_password() -> None:
    """SQLAlchemy cuts at the first @ and shows the rest as the host; the display hides
    up to the last one (the banner used to show half of such a password)."""
    url = "postgresql://ann:Lx7k@Wq3z@db.example/runs"
    assert make_url(url.replace("postgresql", "postgresql+psycopg")).host == "Wq3z@db.example"
    assert redacted(url) == "postgresql://ann:***@db.example/runs"


def test_urls_without_a_password_and_other_schemes() -> None:
    assert redacted("postgresql://u@h/db") == "postgresql://u@h/db"
    assert redacted("postgresql://h/db?application_name=a@b") == (
        "postgresql://h/db?application_name=a@b"
    )
    assert redacted("/home/u/.stepscope/stepscope.db") == "/home/u/.stepscope/stepscope.db"
    assert redacted("http://AKIAXX:Lx7k/Wq3z@minio:9000") == "http://AKIAXX:***@minio:9000"
    assert split_url("no scheme at all") is None
    assert hide_password("auth failed for Lx7k@Wq3z (Lx7k%40Wq3z)", "Lx7k%40Wq3z") == (
        "auth failed for *** (***)"
    )


@pytest.mark.parametrize("password", PASSWORDS)
def test_bad_urls_say_so_without_the_password(tmp_path: Path, password: str) -> None:
    for url, problem in [
        (f"postgresql://ann:{password}@h", "name the database"),
        (f"postgresql://ann:{password}@h:port/db", "port 'port' is not a number"),
        (f"mysql://ann:{password}@h/db", "unknown scheme 'mysql'"),
    ]:
        with pytest.raises(StoreError) as err:
            RunStore(tmp_path, url=url)
        assert problem in str(err.value) and not _leaks(str(err.value)), str(err.value)


# -- printed: the CLI, the dashboard's banner and its pages --------------------------------
@pytest.mark.parametrize("password", PASSWORDS)
def test_cli_on_an_unreachable_server_prints_no_password(tmp_path: Path, password: str) -> None:
    url = f"postgresql://ann:{password}@127.0.0.1:{_free_port()}/runs"
    res = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(tmp_path), "--store", url]
        + ["runs"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1
    assert "postgresql://ann:***@127.0.0.1:" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not _leaks(res.stdout + res.stderr), res.stderr


@pytest.mark.parametrize("password", ["Lx7k@Wq3z", "Lx7k/?#:Wq3z"])
def test_dashboard_banner_prints_no_password(tmp_path: Path, password: str) -> None:
    url = f"postgresql://ann:{password}@127.0.0.1:{_free_port()}/runs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(tmp_path), "--store", url]
        + ["dashboard", "--port", str(_free_port())],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        banner = proc.stdout.readline() if proc.stdout else ""
    finally:
        proc.send_signal(signal.SIGTERM)  # passed on to Streamlit
        out, err = proc.communicate(timeout=60)
    assert "(store postgresql://ann:***@127.0.0.1:" in banner, banner + err
    assert not _leaks(banner + out + err)


def _all_text(at: AppTest) -> str:
    """Every element's content, whatever its kind (a leak may sit in any of them)."""
    parts: list[str] = []

    def walk(node: object) -> None:
        proto = getattr(node, "proto", None)
        if proto is not None:
            parts.append(str(proto))
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at._tree)
    return "\n".join(parts)


@pytest.mark.parametrize("page", ["runs", "run", "compare"])
def test_dashboard_pages_show_no_password(page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"postgresql://ann:Lx7k/?#@:Wq3z@127.0.0.1:{_free_port()}/runs"
    monkeypatch.setenv("STEPSCOPE_STORE", url)
    at = AppTest.from_file(str(ENTRY), default_timeout=60)
    at.run()
    if page != "runs":
        at.switch_page(f"views/{page}/page.py").run()
    assert not at.exception
    assert [e.value for e in at.error] and all(
        e.value.startswith("postgresql://ann:***@127.0.0.1:") for e in at.error
    )
    assert not _leaks(_all_text(at))


# -- recorded: a real run in a real PostgreSQL store that asks for the password -------------
@pytest.fixture
def password_urls(pg_server: PgServer) -> Iterator[list[tuple[str, str]]]:
    """Two roles that must give their passwords (scram over TCP), each owning a fresh
    database: one whose URL holds ``/ ? # @ :`` raw, one whose ``@`` is written %40.
    Yields (url, password) pairs."""
    import psycopg  # local: a dependency of stepscope; only this fixture talks to it
    from psycopg import sql

    tag = uuid.uuid4().hex[:8]
    roles = [(f"ann_{tag}", "Lx7k/?#@:Wq3z", "Lx7k/?#@:Wq3z"), (f"bob_{tag}", "Lx7k@Wq3z", None)]
    admin = f"host=127.0.0.1 port={pg_server.port} user=postgres dbname=postgres"
    hba = pg_server.data / "pg_hba.conf"
    before = hba.read_text()
    with psycopg.connect(admin, autocommit=True) as conn:
        for role, password, _ in roles:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(password)
                )
            )
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(*[sql.Identifier(role)] * 2))
    # these roles only: their password is asked for; every other line stays as it was
    hba.write_text(
        "".join(f"host all {r} 127.0.0.1/32 scram-sha-256\n" for r, *_ in roles) + before
    )
    pg_server._run("pg_ctl", "-D", str(pg_server.data), "reload")
    urls = []
    for role, password, raw in roles:
        written = raw if raw is not None else quote(password, safe="")
        urls.append((f"postgresql://{role}:{written}@127.0.0.1:{pg_server.port}/{role}", password))
    try:
        yield urls
    finally:
        hba.write_text(before)
        pg_server._run("pg_ctl", "-D", str(pg_server.data), "reload")


def _everything_stored(url: str) -> str:
    """Every row of every table of the store's database, as text."""
    import psycopg  # local: as above

    engine_url = make_url(resolve_store_url("/nowhere", url).sqlalchemy)
    with psycopg.connect(
        host=engine_url.host,
        port=engine_url.port,
        user=engine_url.username,
        password=engine_url.password,
        dbname=engine_url.database,
    ) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema='public'"
            )
        ]
        assert "runs" in tables
        return "\n".join(
            json.dumps(list(map(list, conn.execute(f'SELECT * FROM "{t}"'))), default=str)
            for t in tables
        )


def test_a_recorded_run_stores_and_prints_no_password(
    tmp_path: Path, password_urls: list[tuple[str, str]]
) -> None:
    for url, password in password_urls:
        res = subprocess.run(
            [sys.executable, "-m", "stepscope.app.cli", "--home", str(tmp_path / "home")]
            + ["run", "--", sys.executable, "-c", "print('job ran')"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "STEPSCOPE_STORE": url},
        )
        assert res.returncode == 0, res.stderr
        assert "job ran" in res.stdout and "recording run 1" in res.stderr
        assert not _leaks(res.stdout + res.stderr), res.stderr
        with RunStore(tmp_path / "home", url=url) as store:  # connects: the password worked
            run = store.run(1)
            assert run["status"] == "completed"
            assert run["env"]["store"] == redacted(url)
            assert run["env"]["store"].endswith(f"***@127.0.0.1:{url.rsplit(':', 1)[1]}")
        stored = _everything_stored(url)
        assert not _leaks(stored) and password not in stored
        # and what a job records about its environment, in any process
        assert not _leaks(json.dumps(env_summary({"STEPSCOPE_STORE": url})))


def test_an_unreachable_s3_endpoint_is_named_without_its_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """botocore's error class, matched by name as store/artifacts.py matches it."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://AKIAXX:Lx7k/?#@Wq3z@minio.example:9000")
    error = type("EndpointConnectionError", (ConnectionError,), {})("could not connect")
    text = str(s3_error("s3://bucket/runs/1/trace.json.gz", error))
    assert text.endswith("endpoint unreachable (http://AKIAXX:***@minio.example:9000)")
    assert not _leaks(text)


def test_a_password_recorded_by_an_older_version_is_hidden_when_read(tmp_path: Path) -> None:
    """Runs recorded before passwords were hidden hold them in ``env.store``: a reader never
    shows one (the row itself is another version's, left as it is)."""
    home = tmp_path / "home"
    with RunStore(home) as store:
        run_id = store.create_run(["python", "train.py"], name="old", status="completed")
        env = {"store": "postgresql://me:Lx7k/Wq3z@db.example/runs", "vars": {}}
        store._db.execute(
            "UPDATE runs SET env=:e WHERE id=:id", {"e": json.dumps(env), "id": run_id}
        )
        assert store.run(run_id)["env"]["store"] == "postgresql://me:***@db.example/runs"
        assert "Wq3z" not in str(store.runs()["env"].tolist())
    proc = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "show", str(run_id), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and "Wq3z" not in proc.stdout + proc.stderr
