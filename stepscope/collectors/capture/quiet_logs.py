"""Torch's own log lines that a capture would add to the job's output, kept out of it:
kineto's start-up chatter (its level is read from the environment once, as the profiler
starts) and c10's "one per 1000" warning when stepscope frees its own sentinel tensor.
Each is changed only around stepscope's own code, and the user's own setting wins.
Used by ``profiler_capture``; torch is imported only when a level is first needed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

# Kineto's levels (libkineto ILoggerObserver.h, torch 2.13): VERBOSE 0, INFO 1, WARNING 2,
# STAGE 3, ERROR 4, USDT 5. A message prints when its level is >= the set one.
KINETO_LOG_LEVEL_ENV = "KINETO_LOG_LEVEL"
KINETO_QUIET_LEVEL = "6"
# c10's logging (c10/util/Logging.cpp): FLAGS_caffe2_log_level, a message prints when its
# severity is >= it; WARNING is 1 (the default), ERROR 2.
C10_LOG_LEVEL_SYMBOL = "FLAGS_caffe2_log_level"
C10_ERROR = 2


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    """Kineto's log level above all its levels while the profiler starts (module
    docstring): the variable is read then, once per process; the user's own value wins,
    and the job's environment is as it was afterwards."""
    if KINETO_LOG_LEVEL_ENV in os.environ:
        yield
        return
    os.environ[KINETO_LOG_LEVEL_ENV] = KINETO_QUIET_LEVEL
    try:
        yield
    finally:
        os.environ.pop(KINETO_LOG_LEVEL_ENV, None)


@contextlib.contextmanager
def _quiet_c10_warnings() -> Iterator[None]:
    """c10's log level at ERROR around stepscope's own code only (module docstring).

    Where torch's c10 library does not export its level (another build), nothing is
    changed: the warning then prints, as it did without stepscope's capture.
    """
    level = _c10_log_level()
    if level is None or level.value >= C10_ERROR:
        yield
        return
    before = level.value
    level.value = C10_ERROR
    try:
        yield
    finally:
        level.value = before


_C10_LEVEL: list[Any] = []  # the ctypes view of c10's level, looked up once (or None)


def _c10_log_level() -> Any:
    """c10's ``FLAGS_caffe2_log_level`` as a ctypes int, from torch's own libc10; None
    when this torch has no such library or symbol."""
    if not _C10_LEVEL:
        value = None
        with contextlib.suppress(Exception):
            import ctypes  # local: only to read c10's log level, once

            import torch  # local: see the note on torch

            lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
            for name in sorted(os.listdir(lib_dir)):
                if name.startswith(("libc10.", "c10.")) and name.endswith(
                    (".so", ".dylib", ".dll")
                ):
                    lib = ctypes.CDLL(os.path.join(lib_dir, name))
                    value = ctypes.c_int.in_dll(lib, C10_LOG_LEVEL_SYMBOL)
                    break
        _C10_LEVEL.append(value)
    return _C10_LEVEL[0]
