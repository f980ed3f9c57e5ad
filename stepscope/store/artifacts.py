"""Where a run's artifacts (traces, memory snapshots, logs) live: the artifact location.

The default is the run folder, as always: nothing is copied and the artifact's row holds
the local path. ``STEPSCOPE_ARTIFACTS`` (or ``stepscope --artifacts URL``) names another
place: a folder (shared storage) or ``s3://bucket/prefix`` (S3 or an S3-compatible
endpoint, through fsspec/s3fs). An artifact is then copied there once it is complete and
its row holds ``<location>/runs/<id>/<file>``; the file in the run folder stays, as the
first cache. A reader on another machine (the dashboard of a team) downloads an object
once into ``<home>/cache/artifacts/`` and reads it from there afterwards.

Credentials are never part of a location or a URI: s3fs reads the standard AWS variables
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_S3`` for a custom
endpoint) or the AWS config files, so nothing secret reaches the store or the logs.
fsspec and s3fs are imported only when an ``s3://`` location is used (``pip install
'stepscope[s3]'``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from stepscope.store.artifact_paths import ArtifactError, allowed_file, allowed_object
from stepscope.store.bounded_read import max_json_bytes, too_large
from stepscope.store.url import redacted

ARTIFACTS_ENV = "STEPSCOPE_ARTIFACTS"
CACHE_DIR = ("cache", "artifacts")
# Bounded so that an unreachable endpoint costs seconds, not minutes, at a job's end.
S3_CONFIG = {
    "connect_timeout": 5,
    "read_timeout": 60,
    "retries": {"max_attempts": 3, "mode": "standard"},
}


@dataclass(frozen=True)
class Location:
    """An artifact location: ``url`` None is the run folder (the default)."""

    url: str | None = None

    @property
    def is_default(self) -> bool:
        return self.url is None

    @property
    def is_s3(self) -> bool:
        return self.url is not None and self.url.startswith("s3://")

    def uri(self, run_id: int, name: str) -> str:
        """Where the file ``name`` of run ``run_id`` goes: ``<location>/runs/<id>/<name>``."""
        if self.url is None:
            raise ValueError("the default location has no URI of its own")
        return f"{self.url.rstrip('/')}/runs/{int(run_id)}/{name}"


def artifact_location(value: str | None = None) -> Location:
    """The location named by ``value`` (default: ``$STEPSCOPE_ARTIFACTS``), checked.

    Raises ArtifactError for a location stepscope cannot use (another scheme, no bucket,
    credentials written into the URL: they belong in the environment, never in a URI
    that is stored).
    """
    raw = (os.environ.get(ARTIFACTS_ENV, "") if value is None else value).strip()
    if not raw:
        return Location()
    if "://" not in raw:
        return Location(str(Path(raw).expanduser().resolve()))
    parts = urlsplit(raw)
    if parts.scheme != "s3":
        raise ArtifactError(
            f"{raw}: unsupported artifact location (a folder or s3://bucket/prefix)"
        )
    if "@" in parts.netloc or parts.query or parts.fragment:
        raise ArtifactError(
            f"s3://{parts.hostname or ''}/...: credentials or options do not belong in the "
            "artifact location; set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY instead"
        )
    if not parts.netloc:
        raise ArtifactError(f"{raw}: no bucket in the artifact location")
    prefix = "/".join(p for p in parts.path.split("/") if p)
    if any(p in (".", "..") for p in prefix.split("/")):
        raise ArtifactError(f"{raw}: '.' and '..' are not allowed in the artifact location")
    return Location(f"s3://{parts.netloc}" + (f"/{prefix}" if prefix else ""))


def upload(
    local_path: str | os.PathLike[str],
    run_id: int,
    rank: int = 0,
    kind: str = "trace",
    location: Location | None = None,
    fs: Any = None,
) -> str:
    """Copy a complete artifact file to the location; returns the URI to record.

    The local file is kept (it is the cache). With the default location nothing is
    copied and the local path is the URI. ``fs``: an s3fs filesystem to reuse (default:
    a new one). Raises ArtifactError (one line) on failure.
    """
    loc = artifact_location() if location is None else location
    path = Path(local_path)
    if loc.is_default:
        return str(path)
    uri = loc.uri(run_id, path.name)
    if not loc.is_s3:
        try:
            dest = Path(uri)
            dest.parent.mkdir(parents=True, exist_ok=True)
            _atomic_copy(lambda tmp: shutil.copyfile(path, tmp), dest)
        except OSError as exc:
            raise ArtifactError(f"{uri}: cannot copy {path.name} there ({exc})") from None
        return uri
    meta = {"run-id": str(int(run_id)), "rank": str(int(rank)), "kind": kind}
    try:
        (fs or s3_filesystem()).put_file(str(path), uri, Metadata=meta)
    except Exception as exc:
        raise s3_error(uri, exc) from None
    return uri


def local_copy(
    uri_or_path: str | os.PathLike[str],
    home: str | os.PathLike[str],
    local_path: str | os.PathLike[str] | None = None,
    *,
    run_id: int,
) -> Path:
    """A local file holding run ``run_id``'s artifact: ``local_path`` if that file still
    exists, a plain path as it is (its reader says if it is gone), an ``s3://`` object
    from the cache under ``<home>/cache/artifacts/``, downloaded first if it is not there
    yet. Only where stepscope writes that run's files (``artifact_paths.py``): a row
    naming any other file or object is refused in one line, never read.

    A download goes to a temporary name and is renamed into place when complete, so a
    killed download never leaves a half file that looks complete. Raises ArtifactError.
    """
    if local_path:
        with contextlib.suppress(ArtifactError):
            local = allowed_file(local_path, run_id, home, artifact_location())
            if local.is_file():
                return local
    text = str(uri_or_path)
    if not text.startswith("s3://"):
        return allowed_file(text, run_id, home, artifact_location())
    allowed_object(text, run_id, artifact_location())
    target = cache_path(text, home)
    if target.is_file():
        return target
    try:
        fs = s3_filesystem()
        size = int(fs.info(text).get("size") or 0)
        if size > max_json_bytes():  # not fetched at all: the readers would refuse it
            raise ArtifactError(str(too_large(text, size, max_json_bytes(), so_far=False)))
        target.parent.mkdir(parents=True, exist_ok=True)
        _atomic_copy(lambda tmp: fs.get_file(text, str(tmp)), target)
    except ArtifactError:
        raise
    except Exception as exc:
        raise s3_error(text, exc) from None
    return target


def cache_path(uri: str, home: str | os.PathLike[str]) -> Path:
    """Where the object ``uri`` is cached: ``<home>/cache/artifacts/s3/<bucket>/<key>``."""
    parts = urlsplit(uri)
    key = [p for p in parts.path.split("/") if p]
    if not parts.netloc or not key or any(p in (".", "..") for p in key):
        raise ArtifactError(f"{uri}: not an s3://bucket/key URI")
    return Path(home).expanduser().joinpath(*CACHE_DIR, parts.scheme, parts.netloc, *key)


def artifact_files(
    rows: Iterable[Any], home: str | os.PathLike[str]
) -> tuple[list[Path], list[str]]:
    """The local files of artifact rows (``store.artifacts(run)`` records or tuples with
    ``path`` and ``meta``): (files, one line per artifact that cannot be had)."""
    files: list[Path] = []
    problems: list[str] = []
    for row in rows:
        path = row["path"] if isinstance(row, dict) else row.path
        meta = (row.get("meta") if isinstance(row, dict) else getattr(row, "meta", None)) or {}
        run_id = int(row["run_id"] if isinstance(row, dict) else row.run_id)
        try:
            files.append(local_copy(path, home, meta.get("local_path"), run_id=run_id))
        except ArtifactError as exc:
            problems.append(str(exc))
    return files, problems


def kind_files(arts: Any, home: str | os.PathLike[str], kind: str = "trace") -> list[Path]:
    """The local files of a run's artifacts of ``kind`` (``arts``: ``store.artifacts``).

    Raises ArtifactError for the first that cannot be had: a reader analysing a run
    must not silently analyse part of it.
    """
    if arts is None or len(arts) == 0:
        return []
    files, problems = artifact_files(arts[arts["kind"] == kind].itertuples(), home)
    if problems:
        raise ArtifactError(problems[0])
    return files


def upload_run_file(store: Any, run_id: int, name: str, kind: str) -> None:
    """At a run's end, from outside the job: upload the file ``name`` of its run folder
    (a trial's ``output.log``) to a location other than the default, and record it. A
    failure is one line in the run's log and the local file's row."""
    try:
        loc = artifact_location()
    except ArtifactError as exc:
        store.log_event(run_id, "warning", "artifacts", f"{kind} not uploaded: {exc}")
        return
    path = Path(store.home) / "runs" / str(int(run_id)) / name
    if loc.is_default or not path.is_file():
        return
    try:
        uri = upload(path, run_id, 0, kind, loc)
    except ArtifactError as exc:
        store.log_event(
            run_id, "warning", "artifacts", f"{kind} kept in the run folder only: {exc}"
        )
        store.add_artifact(run_id, kind, str(path))
    else:
        store.add_artifact(run_id, kind, uri, meta={"local_path": str(path)})


# -- S3 --------------------------------------------------------------------------------
def s3_filesystem() -> Any:
    """A fresh s3fs filesystem with the bounded timeouts; credentials, region and
    endpoint from the standard AWS environment and config files (nothing of ours)."""
    try:
        import s3fs  # local: optional extra, imported only for an s3:// location
    except ImportError:
        raise ArtifactError(
            "s3:// artifact location: s3fs is not installed (pip install 'stepscope[s3]')"
        ) from None
    return s3fs.S3FileSystem(skip_instance_cache=True, config_kwargs=dict(S3_CONFIG))


def s3_error(uri: str, exc: BaseException) -> ArtifactError:
    """One line naming the URI and what is wrong, from botocore's/s3fs's exceptions
    (matched by class name: botocore is not imported here for that)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    endpoint = (
        os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3"
    )
    if isinstance(exc, ArtifactError):
        return exc
    if names & {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}:
        why = "no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
    elif names & {"EndpointConnectionError", "ConnectTimeoutError", "ConnectionError"}:
        why = f"endpoint unreachable ({redacted(endpoint)})"  # a key in its URL never shows
    elif isinstance(exc, FileNotFoundError) and "bucket" in text.lower():
        why = "bucket missing"
    elif isinstance(exc, FileNotFoundError):
        why = "object missing"
    elif isinstance(exc, PermissionError):
        why = f"access denied ({text})"
    else:
        why = f"{type(exc).__name__}: {text}"
    return ArtifactError(f"{uri}: {why}")


def _atomic_copy(write: Any, dest: Path) -> None:
    """``write(tmp)`` into a temporary file beside ``dest``, renamed onto it when done."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# -- in the job: uploads off the training thread -----------------------------------------
Done = Callable[[str | None, str | None], None]  # done(uri, None) or done(None, error line)
EXIT_WAIT_S = 120.0  # how long a job's end waits for its uploads before keeping local rows
SETTLE_WAIT_S = 10.0  # and then for a row the upload thread is writing at that moment


class BackgroundUploads:
    """Uploads a job's artifacts one at a time on a daemon thread, so the training step
    never waits on the network. Each upload ends in exactly one ``done`` call: with the
    URI, or with one line saying why the file stayed local (failed, or still running when
    the job ended and ``wait`` gave up on it).
    """

    def __init__(self, location: Location) -> None:
        self.location = location
        self._queue: queue.Queue[_Upload] = queue.Queue()
        self._pending: set[_Upload] = set()
        self._settling: set[_Upload] = set()  # pending, its done() running now
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._fs: Any = None
        self._pid = os.getpid()
        self._ended = False

    def prepare(self) -> None:
        """Start the thread (and, for S3, import s3fs and start fsspec's I/O loop on it)
        early, and hook the wait for the uploads into the job's exit."""
        if self._thread is not None and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._loop, name="stepscope-upload", daemon=True)
        try:
            self._thread.start()
            before_thread_pools_close(self._at_exit)
        except RuntimeError:  # the interpreter is exiting already
            self._ended = True

    def submit(self, path: str, run_id: int, rank: int, kind: str, done: Done) -> None:
        self.prepare()
        if self._ended:  # a window still open at the exit: s3fs's HTTP client is gone
            uri = self.location.uri(run_id, Path(path).name)
            with contextlib.suppress(Exception):
                done(None, f"{uri}: not uploaded, the job ended inside the capture window")
            return
        item = _Upload(path, run_id, rank, kind, done)
        with self._lock:
            self._pending.add(item)
        self._queue.put(item)

    def _at_exit(self) -> None:
        self.wait()
        self._ended = True

    def wait(self, timeout: float = EXIT_WAIT_S) -> None:
        """Until every upload has ended, at most ``timeout`` s; the ones still running
        then are settled as local files (their upload may still end; its URI is lost)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending and time.monotonic() < deadline:
                self._lock.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            late = list(self._pending - self._settling)
        for item in late:
            self._settle(item, None, f"{item.path}: upload not finished after {timeout:.0f} s")
        # a row being written on the upload thread as the deadline passed: let it finish
        # (the job closes its writer next), a moment at most
        deadline = time.monotonic() + SETTLE_WAIT_S
        with self._lock:
            while self._settling and time.monotonic() < deadline:
                self._lock.wait(min(0.5, max(0.0, deadline - time.monotonic())))

    def _loop(self) -> None:
        if self.location.is_s3:
            with contextlib.suppress(ArtifactError):
                self._fs = s3_filesystem()
        while True:
            self._run(self._queue.get())

    def _run(self, item: _Upload) -> None:
        try:
            uri = upload(item.path, item.run_id, item.rank, item.kind, self.location, self._fs)
        except Exception as exc:  # never into the job
            error = str(exc) if isinstance(exc, ArtifactError) else s3_error(item.path, exc)
            self._settle(item, None, str(error))
        else:
            self._settle(item, uri, None)

    def _settle(self, item: _Upload, uri: str | None, error: str | None) -> None:
        """One ``done`` per upload. The item stays pending until its ``done`` has
        returned: ``wait`` must not let the job close its writer while the row is
        still being written (a CI run lost a memory timeline's row that way)."""
        with self._lock:
            if item not in self._pending or item in self._settling:
                return
            self._settling.add(item)
        try:
            with contextlib.suppress(Exception):
                item.done(uri, error)
        finally:
            with self._lock:
                self._settling.discard(item)
                self._pending.discard(item)
                self._lock.notify_all()


def before_thread_pools_close(hook: Callable[[], None]) -> None:
    """Run ``hook`` when the main thread ends, before the thread pools shut down: s3fs's
    HTTP client needs one, and ``atexit`` handlers run only after they have shut down.
    threading's own exit hooks (where concurrent.futures shuts its pools) run last
    registered first; without them (another Python), ``atexit``."""
    import concurrent.futures.thread  # noqa: F401  # local: its hook first, so ours runs before

    register = getattr(threading, "_register_atexit", None)
    (register or atexit.register)(hook)


@dataclass(eq=False)
class _Upload:
    path: str
    run_id: int
    rank: int
    kind: str
    done: Done
