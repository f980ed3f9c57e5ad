"""A CPU calibration with round figures for this host, for tests of the roofline's
arithmetic (MFU, roofs, the dashboard's MFU line): the figures are not a measurement."""

from __future__ import annotations

from stepscope.store.calibration import Calibration, host_name

ROUND_CALIBRATION = Calibration(
    matmul_gflops=100.0,
    copy_gbs=20.0,
    triad_gbs=25.0,
    dtype="float32",
    threads=2,
    host=host_name(),
    cpu_model="Test CPU",
    torch_version="2.13.0",
    date="2025-01-02T03:04:05+00:00",
    matmul_size=1024,
    stream_mib=256.0,
    seconds=3.0,
    repeats=5,
)
