"""The device-peak table: every row sourced and sane, names and real traces matched."""

from __future__ import annotations

import re

import pytest

from stepscope.analyzers.hardware.device_peaks import (
    DEVICE_PEAKS,
    match_device,
    match_properties,
    normalise_name,
    peak_for_trace,
    peak_from_calibration,
)
from stepscope.analyzers.trace.load import load_trace
from stepscope.store.calibration import Calibration
from tests.traces import A100, CPU_ONLY, MI250, RANK0, RESNET_NW0, V100_NS, trace_path

REQUIRED = [
    "V100 SXM2", "V100 PCIe", "T4", "A100 SXM4 40GB", "A100 SXM4 80GB", "A100 PCIe 40GB",
    "A100 PCIe 80GB", "A10", "A10G", "L4", "L40S", "H100 SXM", "H100 PCIe", "H100 NVL",
    "H200 SXM", "RTX 3090", "RTX 4090", "RTX A6000", "RTX 6000 Ada", "MI100", "MI210",
    "MI250 (one GCD)", "MI250X (one GCD)", "MI300X",
]  # fmt: skip


def test_the_table_has_every_device_the_issue_names() -> None:
    names = [r.name for r in DEVICE_PEAKS]
    assert len(names) == len(set(names))
    assert set(REQUIRED) <= set(names)


@pytest.mark.parametrize("row", DEVICE_PEAKS, ids=lambda r: r.name)
def test_every_row_is_sourced_and_sane(row) -> None:
    assert row.source.strip() and (
        "datasheet" in row.source or "whitepaper" in row.source or "Baseten" in row.source
    )
    assert row.vendor in ("NVIDIA", "AMD")
    assert row.patterns and all(re.compile(p) for p in row.patterns)
    assert row.fp32 and row.fp32 > 0 and row.memory_gbs > 0
    assert row.units and row.units > 0
    sixteen = [v for v in (row.fp16, row.bf16) if v is not None]
    assert sixteen, "every device since V100 has a 16-bit matmul path"
    for value in sixteen + [row.tf32, row.fp32_matrix]:
        assert value is None or value >= row.fp32
    if row.int8 is not None:
        assert row.int8 >= max(sixteen)
    # a row must match its own name (the table is reachable), except the per-GCD names
    assert match_device(row.name.replace(" (one GCD)", "")) is not None


def test_two_gcd_cards_are_halved_to_one_device() -> None:
    mi250 = next(r for r in DEVICE_PEAKS if r.name == "MI250 (one GCD)")
    mi210 = next(r for r in DEVICE_PEAKS if r.name == "MI210")
    assert mi250.memory_gbs == pytest.approx(3276.8 / 2) == mi210.memory_gbs
    assert mi250.bf16 == pytest.approx(362.1 / 2) and mi250.units == 104 == mi210.units
    assert mi250.memory_gib == 64


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
        ("Tesla V100S-PCIE-32GB", "V100S PCIe"),
        ("Tesla V100-DGXS-32GB", "V100 SXM2"),
        ("Tesla T4", "T4"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA RTX A6000", "RTX A6000"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
        ("AMD Instinct MI100", "MI100"),
        ("AMD Instinct MI210", "MI210"),
        ("AMD Instinct MI250X", "MI250X (one GCD)"),
        ("AMD Instinct MI250", "MI250 (one GCD)"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_real_device_names_match_their_row(name: str, expected: str) -> None:
    row = match_device(name)
    assert row is not None and row.name == expected
    assert name in row.matched_on


@pytest.mark.parametrize(
    "name",
    ["NVIDIA GeForce RTX 3090 Ti", "Quadro RTX 6000", "NVIDIA L40", "AMD Radeon Graphics",
     "Intel(R) Xeon(R) Platinum 8375C CPU", "cpu", ""],
)  # fmt: skip
def test_other_names_match_nothing(name: str) -> None:
    assert match_device(name) is None


def test_memory_picks_between_rows_of_one_name() -> None:
    assert normalise_name("Tesla V100-SXM2_16GB") == "tesla v100 sxm2 16gb"
    assert match_device("NVIDIA A100", memory_gib=79.2).name == "A100 SXM4 80GB"
    assert match_device("NVIDIA A100", memory_gib=39.4).name == "A100 SXM4 40GB"
    # the size in the name wins over the reported memory
    assert match_device("NVIDIA A100-SXM4-80GB", memory_gib=39.4).name == "A100 SXM4 80GB"


def test_generic_amd_name_matches_on_compute_units_and_memory() -> None:
    props = {"name": "AMD Radeon Graphics", "numSms": 110, "warpSize": 64,
             "totalGlobalMem": 68702699520}  # fmt: skip
    row = match_properties(props)
    assert row is not None and row.name == "MI250X (one GCD)"
    assert "generic" in row.matched_on
    assert match_properties({**props, "numSms": 7}) is None
    assert match_properties({**props, "warpSize": 32}) is None  # no NVIDIA row with 110 SMs


@pytest.mark.parametrize(
    ("trace", "expected"),
    [
        (RESNET_NW0, "V100 SXM2"),  # "Tesla V100-DGXS-32GB"
        (V100_NS, "V100 SXM2"),  # "Tesla V100-SXM2-32GB"
        (A100, "A100 SXM4 40GB"),  # "NVIDIA A100-PG509-200", 39.4 GiB
        (MI250, "MI250 (one GCD)"),  # "AMD Radeon Graphics", 104 CUs, 64 GiB
    ],
)
def test_shared_traces_match_their_rows(trace: str, expected: str) -> None:
    peak = peak_for_trace(load_trace(trace_path(trace)))
    assert peak is not None and peak.name == expected


@pytest.mark.parametrize("trace", [CPU_ONLY, RANK0])
def test_traces_without_device_properties_match_nothing(trace: str) -> None:
    assert peak_for_trace(load_trace(trace_path(trace))) is None


def test_matmul_peak_per_dtype() -> None:
    a100 = match_device("NVIDIA A100-SXM4-80GB")
    assert a100.matmul_tflops("float32") == 19.5
    assert a100.matmul_tflops("float32", allow_tf32=True) == 156
    assert a100.matmul_tflops("torch.bfloat16") == 312
    mi250 = match_device("AMD Instinct MI250")
    assert mi250.matmul_tflops("float32") == mi250.fp32_matrix  # matrix cores, no TF32
    v100 = match_device("Tesla V100-SXM2-16GB")
    assert v100.matmul_tflops("bfloat16") is None and v100.matmul_tflops("float16") == 125
    assert a100.ridge_flop_per_byte == pytest.approx(312e12 / 2039e9)


def test_a_calibration_becomes_a_cpu_peak() -> None:
    cal = Calibration(
        matmul_gflops=50.0, copy_gbs=10.0, triad_gbs=12.0, dtype="float32", threads=2,
        host="h", cpu_model="Some CPU", torch_version="2.x", date="2026-01-01T00:00:00+00:00",
        matmul_size=768, stream_mib=64.0, seconds=3.0,
    )  # fmt: skip
    peak = peak_from_calibration(cal)
    assert peak.vendor == "CPU" and peak.fp32 == pytest.approx(0.05) and peak.bf16 is None
    assert peak.memory_gbs == 12.0 and peak.matmul_tflops("float32") == pytest.approx(0.05)
    assert "2026-01-01" in peak.source and "2 threads" in peak.source and "h" in peak.matched_on
