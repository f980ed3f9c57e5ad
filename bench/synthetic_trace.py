"""Write a large, realistic, deterministic Kineto trace for the analysis-speed benchmark.

The shared real traces are at most 35 MB; the speed goals (and the "1 GB within
24 GB of memory" goal) need bigger inputs with the same structure, so the parsers and
analyses do the same work per event as on a real trace:

* ``ProfilerStep#N`` user annotations, a DataLoader annotation and an optimizer
  annotation per step;
* nested ``cpu_op`` events (module op -> aten op -> aten op), each innermost one
  launching a kernel through a ``cuda_runtime`` ``cudaLaunchKernel`` with a correlation
  id, matched by a ``kernel`` event on the compute stream, and an ``ac2g`` flow pair;
* ``gpu_memcpy`` / ``gpu_memset`` through ``cudaMemcpyAsync`` / ``cudaMemsetAsync``;
* NCCL all-reduce kernels on a second stream (``nccl:all_reduce`` annotations);
* ``[memory]`` instant events with running allocated/reserved totals;
* ``deviceProperties``, ``distributedInfo``, ``baseTimeNanoseconds``.

Usage::

    python bench/synthetic_trace.py OUT.json[.gz] [--events 1000000] [--seed 0] [--rank 0]

``--events`` is approximate (whole steps are written). A ``.gz`` path is gzip level 1.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path

import numpy as np
import orjson

_KERNELS = (
    "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1, true>(cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, float*, float, float)",
    "volta_sgemm_128x64_nn",
    "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)",
    "implicit_convolve_sgemm",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float>, unsigned int, float, 4>)",
    "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn",
)
_OPS = (
    ("aten::conv2d", "aten::convolution", "aten::cudnn_convolution"),
    ("aten::linear", "aten::addmm", "aten::mm"),
    ("aten::batch_norm", "aten::_batch_norm_impl_index", "aten::cudnn_batch_norm"),
    ("aten::relu_", "aten::clamp_min_", "aten::clamp_min_"),
    ("aten::mean", "aten::sum", "aten::sum"),
    ("aten::add_", "aten::add_", "aten::add_"),
)
#: events written per launched kernel: 3 cpu_ops, runtime, kernel, 2 flows, 2 [memory]
_PER_KERNEL = 9
_KERNELS_PER_STEP = 400

PID, TID, STREAM, NCCL_STREAM = 1234, 1234, 7, 20
BASE_US = 1_700_000_000_000.0


def _x(cat: str, name: str, pid, tid, ts: float, dur: float, args: dict | None = None) -> bytes:
    ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid}
    ev["ts"] = round(ts, 3)
    ev["dur"] = round(dur, 3)
    if args:
        ev["args"] = args
    return orjson.dumps(ev)


def _flow(ph: str, corr: int, pid, tid, ts: float) -> bytes:
    ev = {"ph": ph, "id": corr, "pid": pid, "tid": tid, "ts": round(ts, 3)}
    ev["cat"] = "ac2g"
    ev["name"] = "ac2g"
    if ph == "f":
        ev["bp"] = "e"
    return orjson.dumps(ev)


def _mem(ts: float, nbytes: int, alloc: int, reserved: int) -> bytes:
    return orjson.dumps(
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "s": "t",
            "name": "[memory]",
            "pid": PID,
            "tid": TID,
            "ts": round(ts, 3),
            "args": {
                "Total Reserved": reserved,
                "Total Allocated": alloc,
                "Bytes": nbytes,
                "Addr": 140000000000 + (alloc % 1_000_000) * 512,
                "Device Id": 0,
                "Device Type": 1,
            },
        }
    )


def generate(out, n_events: int, seed: int = 0, rank: int = 0) -> int:
    """Stream the trace to the binary file ``out``; returns the number of events written."""
    rng = np.random.default_rng(seed)
    steps = max(2, round(n_events / (_KERNELS_PER_STEP * _PER_KERNEL + 40)))
    header = {
        "schemaVersion": 1,
        "deviceProperties": [
            {
                "id": 0,
                "name": "NVIDIA A100-SXM4-80GB",
                "totalGlobalMem": 85_100_000_000,
                "computeMajor": 8,
                "computeMinor": 0,
                "maxThreadsPerBlock": 1024,
                "maxThreadsPerMultiprocessor": 2048,
                "regsPerBlock": 65536,
                "regsPerMultiprocessor": 65536,
                "warpSize": 32,
                "sharedMemPerBlock": 49152,
                "sharedMemPerMultiprocessor": 167936,
                "numSms": 108,
                "sharedMemPerBlockOptin": 166912,
            }
        ],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "traceName": f"synthetic_rank{rank}.json",
    }
    head = orjson.dumps(header)
    out.write(head[:-1] + b', "traceEvents": [\n')
    written = 0
    first = True

    def emit(chunk: list[bytes]) -> None:
        nonlocal first, written
        if not chunk:
            return
        if not first:
            out.write(b",\n")
        out.write(b",\n".join(chunk))
        first = False
        written += len(chunk)

    # metadata events, as Kineto writes them
    emit(
        [
            orjson.dumps(
                {
                    "name": "process_name",
                    "ph": "M",
                    "ts": 0,
                    "pid": PID,
                    "tid": 0,
                    "args": {"name": "python"},
                }
            ),
            orjson.dumps(
                {
                    "name": "process_name",
                    "ph": "M",
                    "ts": 0,
                    "pid": 0,
                    "tid": 0,
                    "args": {"name": "GPU 0"},
                }
            ),
            orjson.dumps(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "ts": 0,
                    "pid": 0,
                    "tid": STREAM,
                    "args": {"name": f"stream {STREAM}"},
                }
            ),
        ]
    )

    t = BASE_US
    gpu_free = BASE_US
    corr = 1000
    ext = 1
    alloc = 2_000_000_000
    reserved = 4_000_000_000
    for step in range(steps):
        ev: list[bytes] = []
        step_start = t
        # DataLoader wait at the top of the step (host only, GPU idles)
        dl = float(rng.uniform(200, 3000))
        ev.append(
            _x(
                "user_annotation",
                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                PID,
                TID,
                t + 1,
                dl,
                {"External id": ext},
            )
        )
        ext += 1
        t += dl + 2
        # H2D copy of the batch
        corr += 1
        ev.append(
            _x(
                "cuda_runtime",
                "cudaMemcpyAsync",
                PID,
                TID,
                t,
                8.0,
                {"External id": ext, "correlation": corr},
            )
        )
        gpu_free = max(gpu_free, t + 4) + 60
        ev.append(
            _x(
                "gpu_memcpy",
                "Memcpy HtoD (Pageable -> Device)",
                0,
                STREAM,
                gpu_free - 60,
                60.0,
                {
                    "device": 0,
                    "context": 1,
                    "stream": STREAM,
                    "correlation": corr,
                    "bytes": 19267584,
                    "memory bandwidth (GB/s)": 321.1,
                },
            )
        )
        t += 10
        durs = rng.gamma(2.0, 20.0, _KERNELS_PER_STEP) + 2.0
        host = rng.uniform(8.0, 30.0, _KERNELS_PER_STEP)
        kinds = rng.integers(0, len(_OPS), _KERNELS_PER_STEP)
        sizes = rng.integers(1, 64, _KERNELS_PER_STEP) * 262144
        for i in range(_KERNELS_PER_STEP):
            ops = _OPS[kinds[i]]
            h = float(host[i])
            ev.append(
                _x(
                    "cpu_op",
                    ops[0],
                    PID,
                    TID,
                    t,
                    h,
                    {
                        "External id": ext,
                        "Sequence number": ext,
                        "Fwd thread id": 0,
                        "Record function id": 0,
                    },
                )
            )
            ev.append(_x("cpu_op", ops[1], PID, TID, t + 1, h - 2, {"External id": ext + 1}))
            ev.append(_x("cpu_op", ops[2], PID, TID, t + 2, h - 4, {"External id": ext + 2}))
            alloc += int(sizes[i])
            ev.append(_mem(t + 2.5, int(sizes[i]), alloc, reserved))
            corr += 1
            launch = t + h - 7
            ev.append(
                _x(
                    "cuda_runtime",
                    "cudaLaunchKernel",
                    PID,
                    TID,
                    launch,
                    5.0,
                    {"External id": ext + 2, "correlation": corr, "cbid": 211},
                )
            )
            ev.append(_flow("s", corr, PID, TID, launch))
            k_start = max(gpu_free, launch + 4.0)
            kd = float(durs[i])
            ev.append(
                _x(
                    "kernel",
                    _KERNELS[kinds[i]],
                    0,
                    STREAM,
                    k_start,
                    kd,
                    {
                        "External id": ext + 2,
                        "queued": 0,
                        "device": 0,
                        "context": 1,
                        "stream": STREAM,
                        "correlation": corr,
                        "registers per thread": 64,
                        "shared memory": 16384,
                        "blocks per SM": 2.5,
                        "warps per SM": 10.0,
                        "grid": [216, 1, 1],
                        "block": [128, 1, 1],
                        "est. achieved occupancy %": 25,
                    },
                )
            )
            ev.append(_flow("f", corr, 0, STREAM, k_start))
            gpu_free = k_start + kd
            alloc -= int(sizes[i])
            ev.append(_mem(t + h - 1, -int(sizes[i]), alloc, reserved))
            ext += 3
            t += h + 1
            if i == _KERNELS_PER_STEP // 2:
                corr += 1
                ev.append(
                    _x(
                        "cuda_runtime",
                        "cudaMemsetAsync",
                        PID,
                        TID,
                        t,
                        4.0,
                        {"External id": ext, "correlation": corr},
                    )
                )
                ev.append(
                    _x(
                        "gpu_memset",
                        "Memset (Device)",
                        0,
                        STREAM,
                        max(gpu_free, t + 3),
                        2.0,
                        {
                            "device": 0,
                            "context": 1,
                            "stream": STREAM,
                            "correlation": corr,
                            "bytes": 4096,
                        },
                    )
                )
                gpu_free = max(gpu_free, t + 3) + 2.0
                t += 5
        # gradient all-reduce on the NCCL stream, overlapping the tail of backward
        corr += 1
        nccl_host = t
        ev.append(
            _x(
                "user_annotation",
                "nccl:all_reduce",
                PID,
                TID,
                nccl_host,
                12.0,
                {"External id": ext},
            )
        )
        ev.append(
            _x(
                "cuda_runtime",
                "cudaLaunchKernel",
                PID,
                TID,
                nccl_host + 2,
                6.0,
                {"External id": ext, "correlation": corr},
            )
        )
        nccl_start = gpu_free - float(rng.uniform(200, 800))
        nccl_dur = float(rng.uniform(800, 2500))
        ev.append(
            _x(
                "kernel",
                "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
                0,
                NCCL_STREAM,
                nccl_start,
                nccl_dur,
                {
                    "External id": ext,
                    "device": 0,
                    "context": 1,
                    "stream": NCCL_STREAM,
                    "correlation": corr,
                    "blocks per SM": 0.02,
                    "est. achieved occupancy %": 0,
                },
            )
        )
        gpu_free = max(gpu_free, nccl_start + nccl_dur)
        ext += 1
        t += 14
        # optimizer step
        opt = float(rng.uniform(300, 900))
        ev.append(
            _x("user_annotation", "Optimizer.step#SGD.step", PID, TID, t, opt, {"External id": ext})
        )
        ext += 1
        t += opt + 2
        # synchronise at the end of the step (as a loss.item() would)
        t = max(t, gpu_free + 5)
        ev.insert(
            0,
            _x(
                "user_annotation",
                f"ProfilerStep#{step}",
                PID,
                TID,
                step_start,
                t - step_start,
                {"External id": ext},
            ),
        )
        ext += 1
        t += 3
        emit(ev)

    out.write(b"\n]}\n")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--events", type=int, default=1_000_000, help="approximate event count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rank", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.suffix == ".gz":
        with gzip.open(args.out, "wb", compresslevel=1) as fh:
            n = generate(fh, args.events, args.seed, args.rank)
    else:
        with open(args.out, "wb", buffering=1 << 22) as fh:
            n = generate(fh, args.events, args.seed, args.rank)
    print(
        f"wrote {n} events to {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
