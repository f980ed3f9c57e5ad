"""The host's measured peak (``Calibration``) and its cache, ``<home>/calibration.json``.

Why here, in the store: the collectors measure the host (``collectors/facts/calibrate.py``)
and the analyzers compare a job's achieved FLOP/s and bytes/s with the measured peak;
the analyzers may not import the collectors (the layers), so the record and the cache
reader sit below both. No torch here: reading the cache must stay cheap.

The cache is one JSON file per stepscope home, keyed by host, dtype and thread count:
a matmul's FLOP/s on a CPU depends on all three (BLAS threads, AVX-512/AMX paths per
dtype), and a home may be shared by several hosts (an NFS home directory). Each entry
keeps its date and conditions, so every ratio computed from it can show them.

The same file keeps each host's run-to-run spread (``NoiseCalibration``, measured by
``stepscope calibrate --noise``: whole runs of one fixed job), under the key
``<host>|noise``; ``stepscope check`` widens a one-run side's interval by it.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

CACHE_FILE = "calibration.json"
#: Bumped when an entry's fields change meaning; entries of another version are ignored.
CACHE_VERSION = 1


@dataclass(frozen=True)
class Calibration:
    """One measurement of this host: matmul FLOP/s and stream-like bandwidth.

    Bandwidth counts bytes as STREAM does (McCalpin's STREAM benchmark): copy moves 2
    arrays (read + write), triad ``a = b + s*c`` moves 3; write-allocate traffic is not
    counted, so the figures are comparable with published STREAM results.
    """

    matmul_gflops: float  # best of the repeats, 2*n^3 FLOPs per n x n matmul
    copy_gbs: float  # GB/s = 1e9 bytes/s
    triad_gbs: float
    dtype: str  # matmul dtype ("float32", "bfloat16"); bandwidth is dtype-independent
    threads: int  # torch intra-op threads during the measurement
    host: str
    cpu_model: str
    torch_version: str
    date: str  # ISO 8601, local time with offset
    matmul_size: int  # n of the n x n matmuls
    stream_mib: float  # size of one bandwidth array, MiB
    seconds: float  # wall time the whole calibration took
    repeats: int = 0  # timed matmul repeats (the best one is kept)

    @property
    def bandwidth_gbs(self) -> float:
        """The one bandwidth figure a roofline uses: triad (reads and writes mixed, as a
        training step's elementwise kernels do), or copy where triad is missing."""
        return self.triad_gbs if self.triad_gbs > 0 else self.copy_gbs

    def conditions(self) -> str:
        """The line shown next to every ratio computed from this measurement."""
        return (
            f"measured {self.date[:16].replace('T', ' ')} on {self.host} ({self.cpu_model}), "
            f"{self.dtype}, {self.threads} thread{'s' if self.threads != 1 else ''}, "
            f"torch {self.torch_version}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        """Build from a cache entry, ignoring keys a newer stepscope may have added."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class NoiseCalibration:
    """This host's run-to-run spread: how much one figure of one unchanged job differs
    between whole runs (processes), as the standard deviation of its log over the runs
    (about its coefficient of variation; 0.05: runs differ by about 5 %)."""

    cv: dict[str, float]  # per statistic of a run: "median", "mean", "p99" step time
    runs: int  # whole runs measured (the spread has runs - 1 degrees of freedom)
    steps: int  # steps per run
    step_s: float  # the job's median step, seconds
    threads: int  # torch threads of the job
    host: str
    cpu_model: str
    torch_version: str
    date: str  # ISO 8601, local time with offset
    load: tuple[float, float]  # 1-minute load average before and after
    seconds: float  # wall time of the whole measurement
    kind: str = "noise"

    def conditions(self) -> str:
        """The words a widened interval shows its source with."""
        return (
            f"stepscope calibrate --noise, {self.date[:16].replace('T', ' ')} on {self.host}: "
            f"{self.runs} runs of {self.steps} {self.step_s * 1e3:.1f} ms steps, "
            f"{self.threads} thread{'s' if self.threads != 1 else ''}, load "
            f"{self.load[0]:.1f}-{self.load[1]:.1f}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NoiseCalibration:
        known = {f.name for f in fields(cls)}
        out = cls(**{k: v for k, v in data.items() if k in known})
        return replace(out, load=tuple(out.load), cv=dict(out.cv))  # type: ignore[arg-type]


def noise_key(host: str) -> str:
    return f"{host}|noise"


def host_name() -> str:
    return socket.gethostname() or "unknown-host"


def cache_key(host: str, dtype: str, threads: int) -> str:
    return f"{host}|{dtype}|{threads}"


def calibration_path(home: str | os.PathLike[str]) -> Path:
    return Path(home).expanduser() / CACHE_FILE


def _read_entries(path: Path) -> dict[str, dict[str, Any]]:
    """The cache's entries; a missing, unreadable or foreign file reads as empty, since
    a calibration can always be measured again and must never break an analysis."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("version") != CACHE_VERSION:
        return {}
    entries = doc.get("entries")
    return entries if isinstance(entries, dict) else {}


def cached_calibration(
    home: str | os.PathLike[str],
    dtype: str = "float32",
    threads: int | None = None,
    *,
    host: str | None = None,
) -> Calibration | None:
    """This host's cached calibration for ``dtype`` at ``threads``, or None.

    ``threads=None`` takes the entry with the most threads for this host and dtype (a
    job usually runs torch's default, all cores); ``host=None`` is this host.
    """
    host = host or host_name()
    entries = _read_entries(calibration_path(home))
    if threads is not None:
        entry = entries.get(cache_key(host, dtype, threads))
        candidates = [entry] if isinstance(entry, dict) else []
    else:
        candidates = [
            e
            for e in entries.values()
            if isinstance(e, dict) and e.get("host") == host and e.get("dtype") == dtype
        ]
        candidates.sort(key=lambda e: int(e.get("threads") or 0), reverse=True)
    for entry in candidates:
        try:
            return Calibration.from_dict(entry)
        except TypeError:  # an entry missing a field: treat it as absent
            continue
    return None


def cached_noise(home: str | os.PathLike[str], host: str | None = None) -> NoiseCalibration | None:
    """The host's cached run-to-run spread (``host=None``: this host), or None."""
    entry = _read_entries(calibration_path(home)).get(noise_key(host or host_name()))
    if not isinstance(entry, dict):
        return None
    try:
        return NoiseCalibration.from_dict(entry)
    except (TypeError, ValueError):  # an entry missing a field: treat it as absent
        return None


def save_calibration(home: str | os.PathLike[str], cal: Calibration | NoiseCalibration) -> Path:
    """Add or replace this measurement's entry; the file is replaced atomically, so a
    reader never sees half a file. Returns the cache's path."""
    path = calibration_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = _read_entries(path)
    if isinstance(cal, NoiseCalibration):
        entries[noise_key(cal.host)] = cal.to_dict()
    else:
        entries[cache_key(cal.host, cal.dtype, cal.threads)] = cal.to_dict()
    doc = {"version": CACHE_VERSION, "entries": entries}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".calibration-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


__all__ = [
    "CACHE_FILE",
    "Calibration",
    "NoiseCalibration",
    "cache_key",
    "cached_calibration",
    "cached_noise",
    "calibration_path",
    "host_name",
    "noise_key",
    "save_calibration",
]
