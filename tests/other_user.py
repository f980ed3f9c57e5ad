"""Run the `stepscope` CLI as another user (``nobody``), from wherever this clone lies.

A test of what stepscope does to a process it may not read (another user's) needs a
stepscope started as that other user. That user must be able to read stepscope and its
packages, which a clone in a private folder (``mktemp -d`` makes mode 0700) does not
allow: the process would die with "No module named 'stepscope'" and the test would say
nothing about stepscope. So when the other user cannot import it where it is, the
package and the environment's site-packages are mirrored into a world-readable
temporary folder, as hard links (a copy where the filesystem differs), and run with an
interpreter of the same version that user can start. Where no other user can be had
(not root, no ``setpriv``), or no such interpreter exists, the test is skipped, with
the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import stepscope

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
PROBE = "import stepscope.app.cli.main, psutil, sqlalchemy, pandas"


def require_another_user() -> None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("needs root, to run a process as another user")
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux), to run a process as another user")


@contextmanager
def stepscope_as_nobody(home: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    """(the argv prefix of `stepscope` as user nobody, its environment), with ``home``
    (made world-writable) as its HOME and store; skips the test when it cannot be had."""
    require_another_user()
    os.chmod(home, 0o777)
    env = {k: v for k, v in os.environ.items() if k != "STEPSCOPE_KEY"}  # its own, in HOME
    env["HOME"] = str(home)
    direct = [*AS_NOBODY, sys.executable, "-m", "stepscope.app.cli"]
    if _runs([*AS_NOBODY, sys.executable, "-c", PROBE], env):
        yield direct, env
        return
    mirror = Path(tempfile.mkdtemp(prefix="stepscope-other-user-"))
    try:
        yield _mirrored(mirror, env)
    finally:
        shutil.rmtree(mirror, ignore_errors=True)


def _mirrored(mirror: Path, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    os.chmod(mirror, 0o755)
    site, src, bin_ = mirror / "site-packages", mirror / "src", mirror / "bin"
    _link_tree(Path(sysconfig.get_paths()["purelib"]), site)
    _link_tree(Path(stepscope.__file__).resolve().parent, src / "stepscope")
    bin_.mkdir()
    py_spy = shutil.which("py-spy", path=sysconfig.get_path("scripts")) or shutil.which("py-spy")
    if py_spy:
        _link(Path(py_spy), bin_ / "py-spy")
    for folder in (site, src, bin_):  # the mirror's own folders: enterable by everyone
        for parent, _, _ in os.walk(folder):
            os.chmod(parent, 0o755)
    boot = (
        f"import sys, site; sys.path[:0] = [{str(src)!r}]; site.addsitedir({str(site)!r}); "
        "from stepscope.app.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )
    env = {**env, "PATH": f"{bin_}{os.pathsep}{env.get('PATH', '')}"}
    for python in _interpreters():
        probe = (
            f"import sys, site; sys.path[:0] = [{str(src)!r}]; site.addsitedir({str(site)!r}); "
            + PROBE
        )
        if _runs([*AS_NOBODY, python, "-I", "-c", probe], env):
            return [*AS_NOBODY, python, "-I", "-c", boot], env
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    pytest.skip(f"no Python {version} that user {NOBODY} may run, to import stepscope with")


def _interpreters() -> list[str]:
    """Pythons of this version, most like this one first (the venv's, its base's)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = [sys.executable, os.path.realpath(sys.executable)]
    found += [getattr(sys, "_base_executable", sys.executable), f"/usr/bin/python{version}"]
    return [p for i, p in enumerate(found) if p and p not in found[:i] and os.path.exists(p)]


def _runs(argv: list[str], env: dict[str, str]) -> bool:
    try:
        return subprocess.run(argv, env=env, capture_output=True, timeout=120).returncode == 0
    except OSError:
        return False


def _link(src: Path, dest: Path) -> None:
    """A hard link where the file is readable by everyone already; else (or on another
    filesystem) a copy made readable: a link shares the file's mode, which is the user's
    and must not change."""
    if src.stat().st_mode & 0o004:
        try:
            os.link(src, dest)
            return
        except OSError:
            pass
    shutil.copy2(src, dest)
    os.chmod(dest, os.stat(dest).st_mode | 0o444)


def _link_tree(src: Path, dest: Path) -> None:
    def link(a: str, b: str) -> None:
        _link(Path(a), Path(b))

    shutil.copytree(src, dest, copy_function=link, symlinks=True)


__all__ = ["NOBODY", "require_another_user", "stepscope_as_nobody"]
