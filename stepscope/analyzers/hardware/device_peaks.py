"""The device's peak: datasheet FLOP/s per dtype and memory bandwidth, matched on its name.

Why a table: achieved FLOP/s or bytes/s mean little alone; over the device's peak they
say how far a kernel, a phase or the step is from the hardware's limit (roofline, MFU).
GPUs' peaks are published per model, so a table matched on the name the trace's
``deviceProperties`` (or NVML) gives is exact enough; CPUs are measured instead
(``stepscope calibrate``, ``peak_from_calibration``).

Conventions, the same for every row of ``DEVICE_PEAKS`` (the text table ``_TABLE``):

- TFLOP/s (int8: TOPS), **dense**: the datasheets' "with sparsity" figures (2:4
  structured sparsity, Ampere and later) are halved, since a training step's matmuls are
  dense. None: the device has no such path (TF32 before Ampere, bf16 on V100/T4).
- Per device as the trace sees it: an MI250/MI250X is two GCDs, each its own device in
  ROCm (and in a trace), so its row holds half the card's datasheet figures.
- ``fp32`` is the vector (CUDA-core / SIMD) rate; ``fp32_matrix`` AMD's fp32 matrix-core
  (MFMA) rate, which a fp32 GEMM reaches; NVIDIA's fp32 GEMMs reach tensor cores only
  through TF32 (``tf32``), when the job allows it.
- Workstation/GeForce rows give fp16/bf16 with fp32 accumulate, as PyTorch's matmuls
  accumulate in fp32 (GeForce runs it at half the fp16-accumulate rate).
- Memory bandwidth in GB/s (1e9 bytes/s), the datasheet figure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stepscope.analyzers.trace.load import Trace
from stepscope.store.calibration import Calibration

#: Two memory sizes are the same device when within this fraction: drivers report less
#: than the marketed size (ECC, reserved memory: an "A100 40GB" shows 39.4 GiB).
MEMORY_TOLERANCE = 0.15


@dataclass(frozen=True)
class DevicePeak:
    """One device's peak figures (see the module docstring for units and conventions)."""

    name: str
    vendor: str  # "NVIDIA", "AMD", or "CPU" for a calibration
    patterns: tuple[str, ...]  # regexes over the normalised name (``normalise_name``)
    fp32: float | None  # TFLOP/s, vector / CUDA cores
    tf32: float | None
    fp16: float | None
    bf16: float | None
    int8: float | None  # TOPS
    memory_gbs: float  # GB/s
    source: str  # the datasheet / whitepaper the figures come from
    memory_gib: float | None = None  # per device, marketed size (disambiguates A100s)
    units: int | None = None  # SMs / CUs per device (matches AMD's generic names)
    fp32_matrix: float | None = None  # TFLOP/s, AMD matrix cores
    note: str = ""
    matched_on: str = ""  # how a lookup chose this row; empty in the table itself

    def matmul_tflops(self, dtype: str, *, allow_tf32: bool = False) -> float | None:
        """The peak a matmul of ``dtype`` can reach: the denominator of MFU.

        float32 takes the fastest fp32 path (matrix cores on AMD; TF32 only when the job
        enabled it, e.g. ``torch.backends.cuda.matmul.allow_tf32``).
        """
        key = dtype.removeprefix("torch.")
        if key in ("float32", "float", "fp32"):
            paths = [self.fp32, self.fp32_matrix, self.tf32 if allow_tf32 else None]
            found = [p for p in paths if p is not None]
            return max(found) if found else None
        return {
            "float16": self.fp16,
            "half": self.fp16,
            "fp16": self.fp16,
            "bfloat16": self.bf16,
            "bf16": self.bf16,
            "int8": self.int8,
            "tf32": self.tf32,
        }.get(key)

    @property
    def ridge_flop_per_byte(self) -> float | None:
        """The roofline's ridge point at the best 16-bit matmul rate (fp32 where none):
        kernels below this arithmetic intensity are bound by memory."""
        peak = self.bf16 or self.fp16 or self.matmul_tflops("float32")
        if not peak or self.memory_gbs <= 0:
            return None
        return peak * 1e12 / (self.memory_gbs * 1e9)


# -- the table ---------------------------------------------------------------------------

SOURCES = {
    "v100": "NVIDIA Tesla V100 GPU Accelerator datasheet (2018)",
    "v100s": "NVIDIA V100 Tensor Core GPU datasheet (2020), V100S PCIe column",
    "t4": "NVIDIA T4 Tensor Core GPU datasheet (2019)",
    "a100": "NVIDIA A100 Tensor Core GPU datasheet (2021)",
    "a10": "NVIDIA A10 Tensor Core GPU datasheet (2021)",
    "a10g": "no NVIDIA datasheet (an AWS-only part, EC2 G5): Baseten, 'NVIDIA A10 vs A10G "
    "for ML model inference' (2023), i.e. 80 SMs at 1.71 GHz, tensor cores at half the A10's "
    "rate per SM",
    "l4": "NVIDIA L4 Tensor Core GPU datasheet (2023)",
    "l40s": "NVIDIA L40S GPU datasheet (2023)",
    "h100": "NVIDIA H100 Tensor Core GPU datasheet (2023)",
    "h200": "NVIDIA H200 Tensor Core GPU datasheet (2024)",
    "ga102": "NVIDIA Ampere GA102 GPU Architecture whitepaper v2.0 (2021), appendix A",
    "ada": "NVIDIA Ada Lovelace GPU Architecture whitepaper v1.1 (2023), appendix A",
    "a6000": "NVIDIA RTX A6000 datasheet (2021); GA102 whitepaper v2.0, appendix A",
    "rtx6000ada": "NVIDIA RTX 6000 Ada Generation datasheet (2022); Ada whitepaper v1.1",
    "mi100": "AMD Instinct MI100 accelerator datasheet (2020)",
    "mi200": "AMD Instinct MI200 series datasheets: MI250X, MI250 (2021), MI210 (2022)",
    "mi300x": "AMD Instinct MI300X accelerator datasheet (2023)",
}

#: One row a line, '|'-separated: name | vendor | patterns (';'-separated regexes over
#: the normalised name) | fp32 | fp32 matrix | tf32 | fp16 | bf16 | int8 | GB/s | GiB |
#: SMs/CUs | devices per card | source key | note. Dense TFLOP/s (TOPS for int8) per
#: card as the source prints it ("-": no such path); a card that shows as two devices
#: (MI250/MI250X: two GCDs) is divided by the parser. Order matters: a specific row
#: comes before a row whose pattern would also match (V100 PCIe before the V100 catch-all).
_TABLE = r"""
V100S PCIe | NVIDIA | \bv100s\b | 16.4 | - | - | 130 | - | - | 1134 | 32 | 80 | 1 | v100s |
V100 PCIe | NVIDIA | \bv100\b.*\bpcie\b | 14 | - | - | 112 | - | - | 900 | - | 80 | 1 | v100 | no bf16, TF32 or int8 tensor path on Volta
V100 SXM2 | NVIDIA | \bv100\b | 15.7 | - | - | 125 | - | - | 900 | - | 80 | 1 | v100 | also V100-DGXS (DGX Station, NVLink boards); its datasheet gives 4 x 120 fp16
T4 | NVIDIA | \bt4\b | 8.1 | - | - | 65 | - | 130 | 320 | 16 | 40 | 1 | t4 | no bf16 or TF32 on Turing
A100 PCIe 80GB | NVIDIA | \ba100\b.*\bpcie\b | 19.5 | - | 156 | 312 | 312 | 624 | 1935 | 80 | 108 | 1 | a100 |
A100 PCIe 40GB | NVIDIA | \ba100\b.*\bpcie\b | 19.5 | - | 156 | 312 | 312 | 624 | 1555 | 40 | 108 | 1 | a100 |
A100 SXM4 40GB | NVIDIA | \ba100\b | 19.5 | - | 156 | 312 | 312 | 624 | 1555 | 40 | 108 | 1 | a100 | also the PG509-200 board name
A100 SXM4 80GB | NVIDIA | \ba100\b | 19.5 | - | 156 | 312 | 312 | 624 | 2039 | 80 | 108 | 1 | a100 | also the PG509-210 board name
A10G | NVIDIA | \ba10g\b | 35 | - | 35 | 70 | 70 | 140 | 600 | 24 | 80 | 1 | a10g | not from a vendor datasheet: lower confidence
A10 | NVIDIA | \ba10\b | 31.2 | - | 62.5 | 125 | 125 | 250 | 600 | 24 | 72 | 1 | a10 |
L4 | NVIDIA | \bl4\b | 30.3 | - | 60 | 121 | 121 | 242.5 | 300 | 24 | 58 | 1 | l4 |
L40S | NVIDIA | \bl40s\b | 91.6 | - | 183 | 366.5 | 366.5 | 733 | 864 | 48 | 142 | 1 | l40s |
H100 PCIe | NVIDIA | \bh100\b.*\bpcie\b | 51 | - | 378 | 756.5 | 756.5 | 1513 | 2000 | 80 | 114 | 1 | h100 |
H100 NVL | NVIDIA | \bh100\b.*\bnvl\b | 60 | - | 417.5 | 835.5 | 835.5 | 1670.5 | 3900 | 94 | 132 | 1 | h100 | per GPU of the NVL pair
H100 SXM | NVIDIA | \bh100\b | 67 | - | 494.5 | 989.5 | 989.5 | 1979 | 3350 | 80 | 132 | 1 | h100 | CUDA names it "NVIDIA H100 80GB HBM3"
H200 NVL | NVIDIA | \bh200\b.*\bnvl\b | 60 | - | 417.5 | 835.5 | 835.5 | 1670.5 | 4800 | 141 | 132 | 1 | h200 |
H200 SXM | NVIDIA | \bh200\b | 67 | - | 494.5 | 989.5 | 989.5 | 1979 | 4800 | 141 | 132 | 1 | h200 |
RTX 3090 | NVIDIA | \brtx 3090\b(?! ti) | 35.6 | - | 35.6 | 71 | 71 | 284 | 936 | 24 | 82 | 1 | ga102 | fp16/bf16 with fp32 accumulate (142 with fp16 accumulate)
RTX 4090 | NVIDIA | \brtx 4090\b | 82.6 | - | 82.6 | 165.2 | 165.2 | 660.6 | 1008 | 24 | 128 | 1 | ada | fp16/bf16 with fp32 accumulate (330.3 with fp16 accumulate)
RTX A6000 | NVIDIA | \brtx a6000\b | 38.7 | - | 77.4 | 154.8 | 154.8 | 309.7 | 768 | 48 | 84 | 1 | a6000 |
RTX 6000 Ada | NVIDIA | \brtx 6000 ada\b | 91.1 | - | 182.1 | 364.2 | 364.2 | 728.5 | 960 | 48 | 142 | 1 | rtx6000ada |
MI100 | AMD | \bmi100\b | 23.1 | 46.1 | - | 184.6 | 92.3 | 184.6 | 1228.8 | 32 | 120 | 1 | mi100 |
MI250X (one GCD) | AMD | \bmi250x\b | 47.9 | 95.7 | - | 383 | 383 | 383 | 3276.8 | 128 | 220 | 2 | mi200 | an MI250X card is two devices (GCDs); figures are per GCD
MI250 (one GCD) | AMD | \bmi250\b | 45.3 | 90.5 | - | 362.1 | 362.1 | 362.1 | 3276.8 | 128 | 208 | 2 | mi200 | an MI250 card is two devices (GCDs); figures are per GCD
MI210 | AMD | \bmi210\b | 22.6 | 45.3 | - | 181 | 181 | 181 | 1638.4 | 64 | 104 | 1 | mi200 |
MI300X | AMD | \bmi300x\b | 163.4 | 163.4 | 653.7 | 1307.4 | 1307.4 | 2614.9 | 5300 | 192 | 304 | 1 | mi300x |
"""


def _num(cell: str) -> float | None:
    return None if cell == "-" else float(cell)


def _parse_table(text: str) -> tuple[DevicePeak, ...]:
    """``_TABLE`` as DevicePeak rows, per device (a two-GCD card's figures halved)."""
    rows = []
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split("|")]
        name, vendor, patterns, *nums, mem_gib, units, per_card, source, note = cells
        split = float(per_card)

        def per_device(cell: str, split: float = split) -> float | None:
            value = _num(cell)
            return None if value is None else round(value / split, 3)

        fp32, fp32_matrix, tf32, fp16, bf16, int8, gbs = (per_device(c) for c in nums)
        gib = per_device(mem_gib)
        rows.append(
            DevicePeak(
                name=name,
                vendor=vendor,
                patterns=tuple(p.strip() for p in patterns.split(";")),
                fp32=fp32,
                tf32=tf32,
                fp16=fp16,
                bf16=bf16,
                int8=int8,
                memory_gbs=gbs or 0.0,
                source=SOURCES[source],
                memory_gib=gib,
                units=None if units == "-" else int(int(units) / split),
                fp32_matrix=fp32_matrix,
                note=note,
            )
        )
    return tuple(rows)


#: Every device's datasheet peak, dense, per device (see the module docstring).
DEVICE_PEAKS: tuple[DevicePeak, ...] = _parse_table(_TABLE)


def normalise_name(name: str) -> str:
    """Lower case, separators ('-', '_', '/', runs of spaces) as one space: "Tesla
    V100-SXM2-16GB" and "tesla v100 sxm2 16gb" read the same to the patterns."""
    return " ".join(re.sub(r"[-_/,()]+", " ", name.lower()).split())


def memory_in_name(name: str) -> float | None:
    """The memory size a name carries ("A100-SXM4-80GB" -> 80), else None."""
    found = re.search(r"(\d+)\s*gb\b", normalise_name(name))
    return float(found.group(1)) if found else None


def _memory_fits(row: DevicePeak, gib: float | None) -> bool:
    if gib is None or row.memory_gib is None:
        return True
    return abs(gib - row.memory_gib) <= MEMORY_TOLERANCE * row.memory_gib


def match_device(
    name: str,
    memory_gib: float | None = None,
    table: Iterable[DevicePeak] | None = None,
) -> DevicePeak | None:
    """The table's row for a device name (CUDA's / ROCm's / NVML's), or None.

    Rows whose patterns match, in table order (specific rows come first); among them the
    first whose memory fits the size in the name, else ``memory_gib`` (the device's
    total memory), else the first. Names match as whole words: "A10" is not "A100" or
    "A10G", "MI250" not "MI250X", "RTX 6000 Ada" not "Quadro RTX 6000".
    """
    norm = normalise_name(name)
    if not norm:
        return None
    rows = [r for r in (DEVICE_PEAKS if table is None else table) if _matches(r, norm)]
    if not rows:
        return None
    hint = memory_in_name(name) or memory_gib
    chosen = next((r for r in rows if _memory_fits(r, hint)), rows[0])
    return dataclasses.replace(chosen, matched_on=f"name {name!r}")


def _matches(row: DevicePeak, norm: str) -> bool:
    return any(re.search(p, norm) for p in row.patterns)


def match_properties(props: dict[str, Any]) -> DevicePeak | None:
    """The row for one ``deviceProperties`` entry of a Kineto trace, or None.

    The name first; where it is generic (ROCm reports "AMD Radeon Graphics" for an
    MI250's GCD) the vendor's row with the same compute units (``numSms``) and memory.
    An MI210 and one MI250 GCD agree on both (104 CUs, 64 GB) and on every per-device
    figure (MI210 datasheet = MI250 datasheet / 2), so either row gives the right peak.
    """
    name = str(props.get("name") or "")
    total = props.get("totalGlobalMem")
    gib = float(total) / 2**30 if isinstance(total, int | float) and total > 0 else None
    row = match_device(name, gib)
    if row is not None:
        return row
    units = props.get("numSms")
    if not isinstance(units, int) or gib is None:
        return None
    vendor = "AMD" if props.get("warpSize") == 64 else "NVIDIA"
    for candidate in DEVICE_PEAKS:
        if (
            candidate.vendor == vendor
            and candidate.units == units
            and candidate.memory_gib is not None
            and _memory_fits(candidate, gib)
        ):
            how = f"{units} compute units and {gib:.0f} GiB (the name {name!r} is generic)"
            return dataclasses.replace(candidate, matched_on=how)
    return None


def device_properties(trace: Trace, rank: int | None = None) -> list[dict[str, Any]]:
    """The ``deviceProperties`` of one rank (the first rank that has any, by default)."""
    ranks = [rank] if rank is not None else trace.ranks
    for r in ranks:
        props = (trace.meta.get(r) or {}).get("deviceProperties") or []
        if props:
            return [p for p in props if isinstance(p, dict)]
    return []


def _used_device_ids(trace: Trace) -> list[int]:
    """Device ids the trace's device events ran on, most events first."""
    ev = trace.events
    if "device" not in ev.columns or "on_device" not in ev.columns:
        return []
    ids = ev.loc[ev["on_device"].to_numpy() & (ev["device"].to_numpy() >= 0), "device"]
    return [int(i) for i in ids.value_counts().index]


def peak_for_trace(trace: Trace, rank: int | None = None) -> DevicePeak | None:
    """The peak of the device a trace ran on, from its ``deviceProperties``; None for a
    CPU-only trace or a device not in the table (use a calibration there).

    A trace lists every device of the host; the one its kernels ran on is used (the
    first listed where the trace has no device events).
    """
    props = device_properties(trace, rank)
    if not props:
        return None
    by_id = {p.get("id"): p for p in props}
    chosen = next((by_id[i] for i in _used_device_ids(trace) if i in by_id), props[0])
    return match_properties(chosen)


def peak_from_calibration(cal: Calibration) -> DevicePeak:
    """A measured CPU peak in the table's shape, so MFU and roofline code need one type.

    Only the measured dtype's matmul rate is filled; the bandwidth is the triad figure.
    ``source`` carries the date and conditions, to be shown next to every ratio.
    """
    tflops = cal.matmul_gflops / 1000.0
    return DevicePeak(
        name=f"CPU {cal.cpu_model}",
        vendor="CPU",
        patterns=(),
        fp32=tflops if cal.dtype == "float32" else None,
        tf32=None,
        fp16=tflops if cal.dtype == "float16" else None,
        bf16=tflops if cal.dtype == "bfloat16" else None,
        int8=None,
        memory_gbs=cal.bandwidth_gbs,
        source=f"stepscope calibrate: {cal.conditions()}",
        note="measured, not a datasheet figure: the best of short repeats on this host",
        matched_on=f"calibration of host {cal.host!r}",
    )


__all__ = [
    "DEVICE_PEAKS",
    "SOURCES",
    "DevicePeak",
    "device_properties",
    "match_device",
    "match_properties",
    "memory_in_name",
    "normalise_name",
    "peak_for_trace",
    "peak_from_calibration",
]
