"""GPU readings through NVML (nvidia-ml-py's ``pynvml`` module).

NVML rather than torch.cuda because the sampler runs beside the job, must not create
a CUDA context of its own, and must see every GPU and every process on it.

Every metric is read on its own: GPUs differ in what they support (power on some
boards, PCIe counters in VMs), and one ``NVMLError_NotSupported`` must cost only that
metric, on that GPU, and only once: a metric that is not supported is not asked again.

Run ``python -m stepscope.collectors.samplers.gpu_sampler`` to print one sample as JSON; on a
machine without a driver it prints why NVML is unavailable.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

# pynvml is imported where it is used: a machine without nvidia-ml-py, or with a broken
# one, loses its GPU readings, not the sampler (``open_nvml`` says why).

# nvmlDeviceGetPcieThroughput measures over 20 ms inside the call, per counter; at a
# 0.5 s sampling interval with 8 GPUs that would be a third of the sampler's time, so
# PCIe is read at most this often and the other readings go on at full rate.
PCIE_EVERY_S = 2.0


@dataclass
class GpuHandle:
    """One GPU: its NVML handle and what we learned it cannot report."""

    index: int
    handle: Any
    name: str = ""
    uuid: str = ""
    unsupported: set[str] = field(default_factory=set)
    pcie_read_at: float = 0.0


def open_nvml() -> tuple[list[GpuHandle] | None, str]:
    """Initialise NVML and list the GPUs; ``(None, reason)`` when there is nothing to read.

    Never raises: a missing driver, a missing library, or a container without the
    device files are all ordinary situations on CPU machines.
    """
    try:
        import pynvml  # local: see the note on pynvml
    except Exception as exc:  # not installed, or broken
        return None, f"pynvml not importable ({exc})"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, _error_text(exc)
    try:
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:
        return None, f"cannot count GPUs ({_error_text(exc)})"
    if count == 0:
        return None, "no GPUs visible to NVML"
    handles: list[GpuHandle] = []
    for i in range(count):
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
        except Exception:
            continue  # one inaccessible GPU (e.g. lost) must not hide the others
        gpu = GpuHandle(index=i, handle=h)
        gpu.name = _text(_try(lambda h=h: pynvml.nvmlDeviceGetName(h)) or "")
        gpu.uuid = _text(_try(lambda h=h: pynvml.nvmlDeviceGetUUID(h)) or "")
        handles.append(gpu)
    if not handles:
        return None, f"NVML lists {count} GPUs but none could be opened"
    return handles, f"{len(handles)} GPU(s)"


def sample_gpu(gpu: GpuHandle, now: float | None = None) -> dict[str, Any]:
    """Read one GPU's metrics; returns ``{"metrics": {name: value}, "processes": {pid: bytes}}``.

    Units are the store's: bytes, percent, watts, degrees C, MHz, bytes/s.
    """
    import pynvml  # local: see the note on pynvml

    now = time.monotonic() if now is None else now
    h = gpu.handle
    metrics: dict[str, float] = {}

    def util() -> dict[str, float]:
        u = pynvml.nvmlDeviceGetUtilizationRates(h)
        return {"util_percent": float(u.gpu), "mem_util_percent": float(u.memory)}

    def memory() -> dict[str, float]:
        m = pynvml.nvmlDeviceGetMemoryInfo(h)
        return {"mem_used_bytes": float(m.used), "mem_total_bytes": float(m.total)}

    def power() -> dict[str, float]:
        return {"power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0}  # milliwatts

    def temperature() -> dict[str, float]:
        t = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        return {"temperature_c": float(t)}

    def sm_clock() -> dict[str, float]:
        return {"sm_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))}

    def pcie() -> dict[str, float]:
        tx = pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        return {"pcie_tx_bytes_per_s": tx * 1024.0, "pcie_rx_bytes_per_s": rx * 1024.0}  # KB/s

    readers: list[tuple[str, Callable[[], dict[str, float]]]] = [
        ("util", util),
        ("memory", memory),
        ("power", power),
        ("temperature", temperature),
        ("sm_clock", sm_clock),
    ]
    if now - gpu.pcie_read_at >= PCIE_EVERY_S:
        gpu.pcie_read_at = now
        readers.append(("pcie", pcie))
    for key, reader in readers:
        if key in gpu.unsupported:
            continue
        values = _read(gpu, key, reader)
        if values:
            metrics.update(values)

    processes: dict[int, float] = {}
    if "processes" not in gpu.unsupported:
        procs = _read(gpu, "processes", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h))
        for p in procs or []:
            used = getattr(p, "usedGpuMemory", None)
            if used is not None:  # None: not available (WDDM, some MIG set-ups)
                processes[int(p.pid)] = processes.get(int(p.pid), 0.0) + float(used)
    return {"metrics": metrics, "processes": processes}


def gpu_rows(
    handles: Iterable[GpuHandle], pids: set[int], t: float
) -> list[tuple[float, str, str, float | None]]:
    """Long-form sample rows for every GPU; per-process memory summed over the job's pids.

    Caveat: in a container without the host PID namespace NVML reports host pids, so
    ``job_mem_used_bytes`` can stay absent even though the job uses the GPU.
    """
    rows: list[tuple[float, str, str, float | None]] = []
    for gpu in handles:
        sample = sample_gpu(gpu)
        scope = f"gpu{gpu.index}"
        for metric, value in sample["metrics"].items():
            rows.append((t, scope, metric, value))
        job = [v for pid, v in sample["processes"].items() if pid in pids]
        if job:
            rows.append((t, scope, "job_mem_used_bytes", sum(job)))
    return rows


def gpus_and_processes() -> list[dict[str, Any]]:
    """Each GPU's name, compute capability and the memory its processes hold (bytes by
    pid): what an attach reads to tell a GPU job from a CPU one. [] without NVML."""
    handles, _ = open_nvml()
    if not handles:
        return []
    import pynvml  # local: see the note on pynvml

    out = []
    try:
        for gpu in handles:
            cap = _try(lambda g=gpu: pynvml.nvmlDeviceGetCudaComputeCapability(g.handle))
            procs = _try(lambda g=gpu: pynvml.nvmlDeviceGetComputeRunningProcesses(g.handle))
            used = {}
            for p in procs or []:
                if getattr(p, "usedGpuMemory", None) is not None:
                    used[int(p.pid)] = used.get(int(p.pid), 0.0) + float(p.usedGpuMemory)
            out.append(
                {
                    "index": gpu.index,
                    "name": gpu.name,
                    "capability": float(f"{cap[0]}.{cap[1]}") if cap else None,
                    "processes": used,
                }
            )
    finally:
        close_nvml()
    return out


def close_nvml() -> None:
    try:
        import pynvml  # local: see the note on pynvml

        pynvml.nvmlShutdown()
    except Exception:
        pass


def _read(gpu: GpuHandle, key: str, reader: Callable[[], Any]) -> Any:
    """Run one NVML read; remember metrics the GPU does not support so they are skipped."""
    try:
        return reader()
    except Exception as exc:
        try:
            import pynvml  # local: see the note on pynvml

            permanent = (
                pynvml.NVMLError_NotSupported,
                pynvml.NVMLError_NoPermission,
                pynvml.NVMLError_FunctionNotFound,  # older driver than the binding
                pynvml.NVMLLibraryMismatchError,
            )
            if isinstance(exc, permanent):
                gpu.unsupported.add(key)
        except Exception:
            pass
        return None  # transient (e.g. GPU busy resetting): try again next tick


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:
        return None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _error_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__


def main() -> int:
    """Print one sample of every GPU as JSON (a check to run on a GPU host)."""
    handles, reason = open_nvml()
    if handles is None:
        print(json.dumps({"available": False, "reason": reason}))
        return 0
    try:
        import pynvml  # local: see the note on pynvml

        driver = _text(_try(pynvml.nvmlSystemGetDriverVersion) or "")
        t0 = time.perf_counter()
        gpus = []
        for gpu in handles:
            sample = sample_gpu(gpu)
            gpus.append(
                {
                    "index": gpu.index,
                    "name": gpu.name,
                    "uuid": gpu.uuid,
                    "metrics": sample["metrics"],
                    "processes": {str(k): v for k, v in sample["processes"].items()},
                    "unsupported": sorted(gpu.unsupported),
                }
            )
        elapsed = time.perf_counter() - t0
        out = {
            "available": True,
            "reason": reason,
            "driver": driver,
            "sample_s": round(elapsed, 4),
            "gpus": gpus,
        }
        print(json.dumps(out, indent=2))
    finally:
        close_nvml()
    return 0


if __name__ == "__main__":
    sys.exit(main())
