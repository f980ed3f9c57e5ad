"""Which files and objects a run's artifact rows may name: only where stepscope writes them.

An artifact row is a path or a URI that a reader opens (the Run page's download button,
every analysis of a run's traces). In a shared store anyone can write that row, so a row
naming ``/etc/passwd``, ``~/.aws/credentials`` or another team's bucket must not be read
for it. Run ``N``'s artifacts are written in exactly three places, and only those are
read, after ``resolve()`` (so neither ``..`` nor a symbolic link leads out):

* its run folder, ``<home>/runs/N/``;
* the artifact location (``STEPSCOPE_ARTIFACTS``) for run N: ``<folder>/runs/N/`` or,
  for ``s3://bucket/prefix``, the keys under ``prefix/runs/N/`` of that bucket;
* the download cache, ``<home>/cache/artifacts/``, into which only such objects go.

A path recorded under another home (the home was moved or copied, or a node of a
multi-node job keeps it elsewhere) is looked for in this home's folder for the run, by
its part after ``runs/N/``.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit


class ArtifactError(OSError):
    """An artifact cannot be stored or read back; the message is one line naming it.

    An OSError, so that readers which already say "this file cannot be read" in one line
    (the dashboard's user errors) say it for an unreachable object too.
    """


def allowed_file(path: str | os.PathLike[str], run_id: int, home: Any, location: Any) -> Path:
    """``path`` resolved, when it lies where run ``run_id``'s files are written; raises
    ArtifactError (one line naming the path) when it does not. ``location``: the
    artifact location (``artifacts.Location``)."""
    resolved = Path(path).expanduser().resolve()
    folders = [run_folder(home, run_id)]
    if location.url is not None and not location.is_s3:
        folders.append(Path(location.url).resolve() / "runs" / str(int(run_id)))
    if any(resolved.is_relative_to(folder) for folder in folders):
        return resolved
    moved = _in_this_home(Path(path), run_id, folders[0])
    if moved is not None:
        return moved
    raise ArtifactError(
        f"run {run_id}: artifact {path} lies outside the folders stepscope writes the run's "
        f"files to ({', '.join(str(f) for f in folders)}); not read"
    )


def allowed_object(uri: str, run_id: int, location: Any) -> str:
    """``uri`` when it is an object of run ``run_id`` under the configured s3:// location;
    raises ArtifactError (one line naming the URI) otherwise."""
    if location.url is None or not location.is_s3:
        raise ArtifactError(
            f"run {run_id}: artifact {uri} is in object storage, but no s3:// artifact "
            "location is set here (STEPSCOPE_ARTIFACTS); not read"
        )
    prefix = f"{location.url.rstrip('/')}/runs/{int(run_id)}/"
    parts = urlsplit(uri)
    key = [p for p in parts.path.split("/") if p]
    if not uri.startswith(prefix) or any(p in (".", "..") for p in key):
        raise ArtifactError(
            f"run {run_id}: artifact {uri} lies outside {prefix} (the configured artifact "
            "location for the run); not read"
        )
    return uri


def run_folder(home: Any, run_id: int) -> Path:
    """``<home>/runs/<id>``, resolved (the home may be reached through a link)."""
    return (Path(home).expanduser() / "runs" / str(int(run_id))).resolve()


def _in_this_home(path: Path, run_id: int, folder: Path) -> Path | None:
    """The file ``.../runs/<run_id>/<rest>`` of another home, in this home's run folder."""
    parts = PurePosixPath(path.as_posix()).parts
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "runs" and parts[i + 1] == str(int(run_id)):
            rest = parts[i + 2 :]
            if not rest or any(p in (".", "..") for p in rest):
                return None
            candidate = folder.joinpath(*rest).resolve()
            return candidate if candidate.is_relative_to(folder) else None
    return None


__all__ = ["ArtifactError", "allowed_file", "allowed_object", "run_folder"]
