"""The system sampler: a process beside the job that samples it and the machine.

A separate process, not a thread in the job, so that sampling never competes with the
job's GIL, sees every process of the job (DataLoader workers, torchrun ranks) from
outside, and keeps going while the job is stuck in C code.

Run as ``python -m stepscope.collectors.samplers.system_sampler --home H --run-id N --pid P``.
It samples every ``--interval`` seconds, writes long-form rows
``(t, scope, metric, value)`` with scope ``proc`` (the job's process tree),
``system`` (the machine) and ``gpu<i>``, commits them about once a second, and stops
(after a last flush) when the root process is gone or on SIGTERM. Each row is stored
with this host's name: a multi-node job's launchers each run a sampler into one run.

CPU figures are computed from cpu-time deltas between two samples rather than with
psutil's ``cpu_percent()``, because the job's tree changes (workers come and go) and a
process seen for the first time would otherwise report 0 %. Beside the CPU the tree
got, ``cpu_demand_percent`` adds the time its threads were ready to run but waited for a
core (Linux's per-thread run-queue delay, ``/proc/<pid>/task/<tid>/schedstat``): on a
machine shared with other work a CPU-bound DataLoader gets less than a core, but it still
asks for one, and what it asks for is what tells CPU work from waiting on I/O.

The tree's CPU counts the children it reaped between two samples too: ``torch.compile``
on a CPU runs a C++ compiler per kernel (15 s of CPU beside the job's own 4 s), unseen
by the ticks; it read as other work, and compiling trials on a quiet machine as "busy".
A worker seen alive is taken off its parent's reaped time when it vanishes, and a tick
never shows more than the host's logical cores: the CPU over that is carried to the next
ticks (a hogwild job once read 38 cores busy on a 2-core host).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from stepscope.collectors.samplers import gpu_sampler
from stepscope.collectors.samplers import process_readings as read
from stepscope.store import RunStore

COMMIT_EVERY_S = 1.0
Row = tuple[float, str, str, float | None]
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


@dataclass
class _ProcState:
    cpu_s: float
    wall: float
    io: tuple[float, float, float, float] | None  # read_bytes, write_bytes, read_chars, write_chars
    threads: dict[int, float] = field(default_factory=dict)  # thread id -> cpu seconds
    queued: dict[int, float] | None = None  # thread id -> seconds waiting for a core
    reaped_s: float = 0.0  # cpu seconds of its children it has reaped
    counted_s: float = 0.0  # cpu seconds this process and its reaped children were counted
    ppid: int | None = None


class ProcessTreeSampler:
    """Samples the root process and all its descendants as one 'proc' scope."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self._procs: dict[int, psutil.Process] = {pid: self.root}
        self._state: dict[tuple[int, float], _ProcState] = {}
        self.pids: set[int] = {pid}
        # parent pid -> cpu seconds of its vanished children already counted, taken off its
        # reaped time as it grows (a child's whole time lands there when it is reaped)
        self._counted_children: dict[int, float] = {}
        self._cores = os.cpu_count() or 1
        self._carry_s = 0.0  # cpu seconds over the host's cores, shown in the next ticks
        self._last_wall = 0.0

    def _note_vanished(self, keys: set[tuple[int, float]], pids: set[int]) -> None:
        """Take the CPU already counted for processes gone since the last tick off their
        parent's reaped time, before that time is read this tick: a worker reaped within
        the tick it vanished was otherwise counted twice, its whole life at once."""
        for key, old in self._state.items():
            if key not in keys and old.ppid in pids and old.counted_s > 0:
                self._counted_children[old.ppid] = (
                    self._counted_children.get(old.ppid, 0.0) + old.counted_s
                )

    def _within_host(self, cpu_percent: float, dt: float) -> float:
        """The tree's CPU this tick, never above the host's logical cores: what is over
        (a child never seen alive, whose whole life lands in its parent's reaped time at
        once) is carried to the next ticks, so that the total is kept."""
        if dt <= 0:
            return min(cpu_percent, self._cores * 100.0)
        wanted = cpu_percent + self._carry_s / dt * 100.0
        shown = min(wanted, self._cores * 100.0)
        self._carry_s = (wanted - shown) / 100.0 * dt
        return shown

    def root_alive(self) -> bool:
        try:
            return self.root.is_running() and self.root.status() != psutil.STATUS_ZOMBIE
        except _GONE:
            return False

    def _tree(self) -> list[psutil.Process]:
        try:
            children = self.root.children(recursive=True)
        except _GONE:
            children = []
        procs = [self.root]
        for child in children:
            # keep the cached Process objects: they carry psutil's pid-reuse check
            known = self._procs.get(child.pid)
            procs.append(known if known is not None else child)
        self._procs = {p.pid: p for p in procs}
        return procs

    def sample(self, t: float) -> list[Row]:
        procs = self._tree()
        now = time.monotonic()
        total_cpu = 0.0
        max_proc_cpu = 0.0
        max_thread_cpu = 0.0
        waited = 0.0
        have_waits = True
        rss = 0.0
        threads = 0
        io_rate = [0.0, 0.0, 0.0, 0.0]
        have_io = False
        alive = 0
        new_state: dict[tuple[int, float], _ProcState] = {}
        pids: set[int] = set()
        readings = []
        for proc in procs:
            try:
                with proc.oneshot():
                    key = (proc.pid, proc.create_time())
                    ct = proc.cpu_times()
                    cpu_s = ct.user + ct.system
                    reaped_s = getattr(ct, "children_user", 0.0) + getattr(
                        ct, "children_system", 0.0
                    )
                    ppid = proc.ppid()
                    mem = proc.memory_info()
                    n_threads = proc.num_threads()
                    io = read.io(proc)
                thread_times = read.thread_times(proc)
                queued = read.run_queue_waits(proc.pid)
            except _GONE:
                continue  # vanished between listing and reading: not an error
            readings.append(
                (proc, key, cpu_s, reaped_s, ppid, mem, n_threads, io, thread_times, queued)
            )
        self._note_vanished({key for _, key, *_ in readings}, {r[0].pid for r in readings})
        for proc, key, cpu_s, reaped_s, ppid, mem, n_threads, io, thread_times, queued in readings:
            alive += 1
            pids.add(proc.pid)
            rss += mem.rss
            threads += n_threads
            prev = self._state.get(key)
            counted = 0.0
            if prev is not None and now > prev.wall:
                dt = now - prev.wall
                cpu = max(0.0, cpu_s - prev.cpu_s) / dt * 100.0
                reaped = max(0.0, reaped_s - prev.reaped_s)
                seen = min(self._counted_children.get(proc.pid, 0.0), reaped)
                if seen:
                    self._counted_children[proc.pid] -= seen
                counted = prev.counted_s + max(0.0, cpu_s - prev.cpu_s) + reaped - seen
                total_cpu += cpu + (reaped - seen) / dt * 100.0
                max_proc_cpu = max(max_proc_cpu, cpu)
                for tid, tcpu in thread_times.items():
                    before = prev.threads.get(tid)
                    if before is not None:
                        max_thread_cpu = max(max_thread_cpu, max(0.0, tcpu - before) / dt * 100.0)
                if queued is None or prev.queued is None:
                    have_waits = False  # the kernel does not say (not Linux, no schedstat)
                else:
                    # a thread born since the last sample waited all its life in this window
                    waited += (
                        sum(max(0.0, q - prev.queued.get(tid, 0.0)) for tid, q in queued.items())
                        / dt
                        * 100.0
                    )
                if io is not None and prev.io is not None:
                    have_io = True
                    for i in range(4):
                        io_rate[i] += max(0.0, io[i] - prev.io[i]) / dt
            new_state[key] = _ProcState(
                cpu_s, now, io, thread_times, queued, reaped_s, counted, ppid
            )
        first = not self._state
        if not first:
            total_cpu = self._within_host(total_cpu, now - self._last_wall)
        self._last_wall = now
        self._state = new_state
        self.pids = pids or self.pids
        if alive == 0:
            return []
        rows: list[Row] = [
            (t, "proc", "rss_bytes", rss),
            (t, "proc", "threads", float(threads)),
            (t, "proc", "children", float(alive - 1)),
        ]
        if not first:  # rates need two samples
            rows += [
                (t, "proc", "cpu_percent", total_cpu),
                (t, "proc", "cpu_max_process_percent", max_proc_cpu),
                (t, "proc", "cpu_max_thread_percent", max_thread_cpu),
            ]
            if have_waits:
                rows.append((t, "proc", "cpu_demand_percent", total_cpu + waited))
            if have_io:
                rows += [
                    (t, "proc", "read_bytes_per_s", io_rate[0]),
                    (t, "proc", "write_bytes_per_s", io_rate[1]),
                    (t, "proc", "read_chars_per_s", io_rate[2]),
                    (t, "proc", "write_chars_per_s", io_rate[3]),
                ]
        return rows


class MachineSampler:
    """Samples the whole machine as the 'system' scope."""

    def __init__(self) -> None:
        self._wall = time.monotonic()
        self._cpu = _safe(lambda: psutil.cpu_times(percpu=True))
        self._disk = _safe(lambda: psutil.disk_io_counters(perdisk=False))
        self._net = _safe(lambda: psutil.net_io_counters(pernic=False))

    def sample(self, t: float) -> list[Row]:
        now = time.monotonic()
        dt = max(now - self._wall, 1e-6)
        self._wall = now
        rows: list[Row] = []

        cpu = _safe(lambda: psutil.cpu_times(percpu=True))
        if cpu and self._cpu and len(cpu) == len(self._cpu):
            busy_pcts, iowait_total, tot_total, busy_total = [], 0.0, 0.0, 0.0
            for before, after in zip(self._cpu, cpu, strict=True):
                tot = _cpu_total(after) - _cpu_total(before)
                busy = tot - _delta(before, after, "idle") - _delta(before, after, "iowait")
                if tot > 0:
                    busy_pcts.append(max(0.0, min(100.0, busy / tot * 100.0)))
                tot_total += max(tot, 0.0)
                busy_total += max(busy, 0.0)
                iowait_total += _delta(before, after, "iowait")
            if tot_total > 0:
                rows.append((t, "system", "cpu_percent", busy_total / tot_total * 100.0))
                if hasattr(cpu[0], "iowait"):
                    rows.append((t, "system", "iowait_percent", iowait_total / tot_total * 100.0))
            if busy_pcts:
                rows.append((t, "system", "cpu_max_core_percent", max(busy_pcts)))
            rows.append((t, "system", "cpu_count", float(len(cpu))))
        self._cpu = cpu or self._cpu

        mem = _safe(psutil.virtual_memory)
        if mem is not None:
            rows += [
                (t, "system", "mem_used_bytes", float(mem.total - mem.available)),
                (t, "system", "mem_available_bytes", float(mem.available)),
                (t, "system", "mem_total_bytes", float(mem.total)),
            ]

        disk = _safe(lambda: psutil.disk_io_counters(perdisk=False))
        if disk is not None and self._disk is not None:
            rows += [
                (t, "system", "disk_read_bytes_per_s", _rate(self._disk, disk, "read_bytes", dt)),
                (t, "system", "disk_write_bytes_per_s", _rate(self._disk, disk, "write_bytes", dt)),
            ]
        self._disk = disk or self._disk

        net = _safe(lambda: psutil.net_io_counters(pernic=False))
        if net is not None and self._net is not None:
            rows += [
                (t, "system", "net_recv_bytes_per_s", _rate(self._net, net, "bytes_recv", dt)),
                (t, "system", "net_sent_bytes_per_s", _rate(self._net, net, "bytes_sent", dt)),
            ]
        self._net = net or self._net
        return rows


def run_sampler(
    home: str | None,
    run_id: int,
    pid: int,
    interval: float = 0.5,
    *,
    gpu: bool = True,
    stop: threading.Event | None = None,
) -> int:
    """Sample until the root process is gone or ``stop`` is set; returns rows written.

    Opening the store raises its own error (StoreError), which main() reports.
    """
    stop = stop or threading.Event()
    try:
        tree = ProcessTreeSampler(pid)
    except _GONE:
        return 0  # the job was over before we started: nothing to sample, nothing to say
    machine = MachineSampler()
    store = RunStore(home)

    events: list[tuple[str, str, str]] = []
    handles = None
    if gpu:
        handles, reason = gpu_sampler.open_nvml()
        if handles is None:
            events.append(("info", "gpu_sampler", f"NVML unavailable: {reason}, GPU sampling off"))
        else:
            names = ", ".join(f"{g.index}: {g.name}" for g in handles)
            events.append(("info", "gpu_sampler", f"sampling GPUs ({names})"))

    host = socket.gethostname()
    pending: list[Row] = []
    written = 0
    last_commit = time.monotonic()
    next_tick = time.monotonic()
    try:
        while True:
            t = time.time()
            pending += tree.sample(t)
            pending += machine.sample(t)
            if handles:
                try:
                    pending += gpu_sampler.gpu_rows(handles, tree.pids, t)
                except Exception as exc:  # never let a GPU problem stop CPU sampling
                    events.append(("warning", "gpu_sampler", f"GPU sampling off: {exc!r}"))
                    handles = None
            if time.monotonic() - last_commit >= COMMIT_EVERY_S:
                written += _commit(store, run_id, pending, events, host)
                pending, events = [], []
                last_commit = time.monotonic()
            if not tree.root_alive():
                break
            next_tick += interval
            delay = next_tick - time.monotonic()
            if delay < 0:  # fell behind (suspended machine): do not burst to catch up
                next_tick = time.monotonic()
                delay = 0
            if stop.wait(delay):
                break
        written += _commit(store, run_id, pending, events, host)
    finally:
        store.close()
        if handles:
            gpu_sampler.close_nvml()
    return written


def _commit(
    store: Any, run_id: int, rows: list[Row], events: list[tuple[str, str, str]], host: str
) -> int:
    if not rows and not events:
        return 0
    try:
        for level, source, message in events:
            store.log_event(run_id, level, source, message)
        store.add_samples(run_id, rows, host=host)
    except Exception as exc:  # a locked or full disk must not crash the sampler
        print(f"stepscope sampler: cannot write samples ({exc})", file=sys.stderr)
        return 0
    return len(rows)


def _cpu_total(times: Any) -> float:
    # guest time is already counted in user/nice on Linux (same as psutil and htop)
    return sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


def _delta(before: Any, after: Any, name: str) -> float:
    return max(0.0, getattr(after, name, 0.0) - getattr(before, name, 0.0))


def _rate(before: Any, after: Any, name: str, dt: float) -> float:
    return max(0.0, getattr(after, name) - getattr(before, name)) / dt


def _safe(fn: Callable[[], Any]) -> Any:
    """Machine counters missing in containers (no /proc/diskstats) are skipped, not fatal."""
    try:
        return fn()
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stepscope.collectors.samplers.system_sampler")
    parser.add_argument("--home", help="run store directory")
    parser.add_argument("--run-id", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True, help="root process of the job")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--no-gpu", action="store_true", help="do not try NVML")
    args = parser.parse_args(argv)

    stop = threading.Event()

    def _on_signal(signum: int, frame: Any) -> None:
        stop.set()  # the loop flushes what it has and returns

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        run_sampler(
            args.home,
            args.run_id,
            args.pid,
            max(args.interval, 0.05),
            gpu=not args.no_gpu,
            stop=stop,
        )
    except Exception as exc:
        print(f"stepscope sampler: stopped ({exc!r})", file=sys.stderr)
        try:
            with RunStore(args.home) as store:
                store.log_event(args.run_id, "error", "system_sampler", f"stopped: {exc!r}")
        except Exception:
            pass
        return 1
    return 0


if __name__ == "__main__":
    os.environ.pop("STEPSCOPE_RUN_ID", None)  # never let a bootstrap think we are the job
    sys.exit(main())
