"""Device profiles: peak FLOP/s per dtype, memory bandwidth and power, each with its source.

The host CPU's profile is measured by a short micro-benchmark (streaming read bandwidth with numba,
float32 GEMM with numpy) and cached per machine; the others are published figures.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..hostinfo import host_cores, host_cpu_name
from ..paths import cache_dir

GB = 1e9
TERA = 1e12


@dataclass(frozen=True)
class DeviceProfile:
    """Peak capabilities of a device. ``how`` is ``published`` or ``measured (...)``."""

    key: str
    name: str
    kind: str  # cpu | gpu | npu
    peak_flops: dict[str, float]  # dtype -> FLOP/s (OP/s for integer types)
    mem_bw: float  # bytes/s the device can stream from its memory
    power_w: float | None
    how: str
    sources: dict[str, str] = field(default_factory=dict)
    unified_memory: bool = True  # shares system memory with the host (zero-copy transfers)
    notes: str = ""
    # NPUs: the AIE array behind the peak figures (columns, rows, clock, memories, DMA, launch cost);
    # the NPU emulator's cost model reads it (workbench.backends.npu.arch)
    array: dict = field(default_factory=dict)

    def peak(self, dtype: str = "fp32") -> float:
        """Peak FLOP/s for ``dtype``, falling back to fp32 when the dtype has no figure of its own."""
        return self.peak_flops.get(dtype) or self.peak_flops["fp32"]

    def to_dict(self) -> dict:
        return asdict(self)


def _aie_array(generation: str, physical_columns: int, usable_columns: int, clock_ghz: float) -> dict:
    """AIE array geometry: every AIE-ML core has 64 KiB data memory, every memory tile 512 KiB, each DMA
    channel moves 32 bit per cycle, 4 compute rows; clocks follow from the published TOPS (npu1: 10 TOPS =
    20 cores x 256 int8 MAC x 2 x 1.0 GHz; Hawk Point 16 TOPS at 1.6 GHz; npu2: 50 TOPS = 32 x 512 x 2 x
    1.53 GHz). One design uses at most ``usable_columns`` (mlir-aie's npu1_4col, npu2). An XRT launch costs
    ~120-160 us (published; midpoint used: docs/backend-npu.md#the-cost-model-and-its-figures)."""
    return {
        "generation": generation,
        "physical_columns": physical_columns,
        "usable_columns": usable_columns,
        "rows": 4,
        "clock_ghz": clock_ghz,
        "core_memory_kib": 64,
        "memtile_kib": 512,
        "dma_bytes_per_cycle": 4,
        "shim_channels_per_column": 2,
        "launch_us": 140.0,
    }


_SRC_780M = (
    "AMD Radeon 780M product page (amd.com) and TechPowerUp GPU database: 12 CUs, 768 shaders, 2.7 GHz"
)
PUBLISHED: dict[str, DeviceProfile] = {
    p.key: p
    for p in [
        DeviceProfile(
            "780m",
            "AMD Radeon 780M (RDNA3, Phoenix/Hawk Point)",
            "gpu",
            {"fp32": 8.29 * TERA, "fp16": 16.59 * TERA, "bf16": 16.59 * TERA, "int8": 16.59 * TERA},
            89.6 * GB,
            15.0,
            "published",
            {
                "peak_flops": _SRC_780M + " (fp32 with dual issue; fp16/bf16 via WMMA at 2x)",
                "mem_bw": "DDR5-5600 dual channel, 128-bit: 89.6 GB/s peak (LPDDR5x-7500: 120 GB/s); "
                "llama.cpp decode figures imply ~73-80 GB/s effective",
                "power_w": "iGPU share under LLM load ~14-15 W (FastFlowLM comparison figures; 15-54 W cTDP APU)",
            },
        ),
        DeviceProfile(
            "npu1",
            "AMD XDNA NPU, Phoenix (npu1: 4 columns x 4 AIE-ML cores)",
            "npu",
            {"int8": 10 * TERA, "bf16": 5 * TERA, "int16": 2.5 * TERA, "fp32": 5 * TERA},
            32 * GB,
            1.5,
            "published",
            {
                "peak_flops": "AMD Ryzen 7040 (Phoenix) spec: 10 TOPS int8 NPU; bf16 at half the int8 MAC rate, "
                "int16 at a quarter (AIE-ML MAC tiles: i8 4x8x8, bf16 4x8x4, i16 4x4x4)",
                "mem_bw": "derived: 4 shim columns x 2 input DMA channels x 32 bit/cycle at ~1 GHz = 32 GB/s "
                "into the array (system DDR5-5600 peaks at 89.6 GB/s)",
                "power_w": "NPU active power ~1.5 W (FastFlowLM published figure for XDNA2 decode; same class)",
            },
            notes="no fp32 datapath: fp32 figure is the bf16 rate (inputs rounded to bf16)",
            array=_aie_array("npu1", 5, 4, 1.0),
        ),
        DeviceProfile(
            "hawkpoint",
            "AMD XDNA NPU, Hawk Point (npu1: 4 columns x 4 AIE-ML cores, higher clock)",
            "npu",
            {"int8": 16 * TERA, "bf16": 8 * TERA, "int16": 4 * TERA, "fp32": 8 * TERA},
            32 * GB,
            1.5,
            "published",
            {
                "peak_flops": "AMD Ryzen 8040 (Hawk Point) spec: 16 TOPS int8 NPU; bf16 at half, int16 at a quarter",
                "mem_bw": "derived as for Phoenix: 4 shim columns x 2 DMA channels x 4 GB/s",
                "power_w": "~1.5 W NPU active power (FastFlowLM figure for the XDNA family)",
            },
            array=_aie_array("npu1", 5, 4, 1.6),
        ),
        DeviceProfile(
            "890m",
            "AMD Radeon 890M (RDNA3.5, Strix Point)",
            "gpu",
            {"fp32": 11.88 * TERA, "fp16": 23.76 * TERA, "bf16": 23.76 * TERA, "int8": 23.76 * TERA},
            120 * GB,
            15.0,
            "published",
            {
                "peak_flops": "AMD Ryzen AI 9 HX 370 spec / TechPowerUp: 16 CUs, 1024 shaders, 2.9 GHz, dual issue",
                "mem_bw": "LPDDR5x-7500, 128-bit: 120 GB/s peak",
                "power_w": "iGPU ~14 W under LLM decode (FastFlowLM comparison figure)",
            },
        ),
        DeviceProfile(
            "npu2",
            "AMD XDNA2 NPU, Strix Point (npu2: 8 columns x 4 AIE-ML cores)",
            "npu",
            {"int8": 50 * TERA, "bf16": 25 * TERA, "int16": 12.5 * TERA, "fp32": 25 * TERA},
            64 * GB,
            1.5,
            "published",
            {
                "peak_flops": "AMD Ryzen AI 300 spec: 50 TOPS int8 (XDNA2); bf16 at half the int8 rate",
                "mem_bw": "derived: 8 shim columns x 2 input DMA channels x 4 GB/s = 64 GB/s (LPDDR5x 120 GB/s)",
                "power_w": "FastFlowLM: Llama 3.2 1B decode at 36.7 tok/s using ~1.5 W on XDNA2",
            },
            array=_aie_array("npu2", 8, 8, 1.53),
        ),
        DeviceProfile(
            "h100",
            "NVIDIA H100 SXM5 80 GB",
            "gpu",
            {"fp32": 66.9 * TERA, "fp16": 989 * TERA, "bf16": 989 * TERA, "int8": 1979 * TERA},
            3.35 * TERA,
            700.0,
            "published",
            {
                "peak_flops": "NVIDIA H100 datasheet (SXM5): 67 TFLOPS fp32, 989 TFLOPS dense fp16/bf16 tensor core, "
                "1979 TOPS int8; Vulkan compute without cooperative matrix reaches the fp32 CUDA-core rate",
                "mem_bw": "NVIDIA H100 datasheet (SXM5): HBM3 3.35 TB/s",
                "power_w": "NVIDIA H100 datasheet (SXM5): up to 700 W TDP",
            },
            unified_memory=False,
        ),
        DeviceProfile(
            "h200",
            "NVIDIA H200 SXM 141 GB",
            "gpu",
            {"fp32": 66.9 * TERA, "fp16": 989 * TERA, "bf16": 989 * TERA, "int8": 1979 * TERA},
            4.8 * TERA,
            700.0,
            "published",
            {
                "peak_flops": "NVIDIA H200 datasheet (SXM): the H100 SXM5's compute, 67 TFLOPS fp32, 989 TFLOPS "
                "dense fp16/bf16 tensor core, 1979 TOPS int8",
                "mem_bw": "NVIDIA H200 datasheet (SXM): HBM3e 4.8 TB/s",
                "power_w": "NVIDIA H200 datasheet (SXM): up to 700 W TDP",
            },
            unified_memory=False,
        ),
    ]
}
# a device with no published figures (a GPU this table lacks): its ops are profiled with their times, bytes
# and FLOPs, and their fractions of peak are NaN rather than against another device's peaks
UNKNOWN = DeviceProfile(
    "unknown",
    "a device with no published figures",
    "gpu",
    {"fp32": float("nan")},
    float("nan"),
    None,
    "unknown: no published peak figures for this device; fractions of peak not computed",
    unified_memory=False,
)
ALIASES = {
    "radeon-780m": "780m",
    "phoenix": "npu1",
    "xdna": "npu1",
    "hawk-point": "hawkpoint",
    "strix": "890m",
    "radeon-890m": "890m",
    "xdna2": "npu2",
    "strix-npu": "npu2",
    "nvidia-h100": "h100",
    "nvidia-h200": "h200",
    "cpu": "host",
}


def stream_buffer(mb: int = 256) -> np.ndarray:
    """The array :func:`stream_read_gbs` reads (allocate once to measure repeatedly)."""
    return np.ones(mb * 2**20 // 4, dtype=np.float32)


def stream_read_gbs(threads: int, mb: int = 256, repeats: int = 5, arr: np.ndarray | None = None) -> float:
    """Host streaming read bandwidth (GB/s): a numba prange sum over ``mb`` MiB (or ``arr``), best of
    ``repeats``, on ``threads`` threads."""
    from .. import numba_jit

    nb = numba_jit.numba
    arr = stream_buffer(mb) if arr is None else arr
    prev = nb.get_num_threads()
    nb.set_num_threads(threads)
    try:
        fn = numba_jit.stream_sum
        fn(arr)  # compile / load from cache
        best = 0.0
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(arr)
            best = max(best, arr.nbytes / (time.perf_counter() - t0))
    finally:
        nb.set_num_threads(prev)
    return best / GB


def thread_round_trip_us(threads: int, loops: int = 2000) -> float:
    """Microseconds of one empty numba parallel loop on ``threads`` threads (hand the work out, wait for the
    threads), median of 5 batches of ``loops``. On a VM it can move with the host's bandwidth (vCPUs placed
    on one chiplet or on two, where every exchange of data costs more: docs/backend-cpu.md#machines)."""
    from .. import numba_jit

    nb = numba_jit.numba
    a = np.zeros((max(threads, 1), 16), np.float32)
    prev = nb.get_num_threads()
    nb.set_num_threads(threads)
    try:
        numba_jit.fork_joins(a, 2)  # compile / load from cache
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            numba_jit.fork_joins(a, loops)
            times.append((time.perf_counter() - t0) / loops)
    finally:
        nb.set_num_threads(prev)
    return float(np.median(times)) * 1e6


def _gemm_gflops(n: int = 1536, repeats: int = 3) -> float:
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = a.T.copy()
    a @ b
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best / 1e9


BUSY_LOAD = 0.5  # 1-minute load average per core above which a host measurement is taken as disturbed
QUIETER = 0.25  # a busy measurement is taken again when the load per core is this much lower (or not busy)


def _load_per_core(cores: int) -> float:
    return os.getloadavg()[0] / cores


def host_profile(refresh: bool = False) -> DeviceProfile:
    """This machine's CPU, measured once (about 3 s) and cached per machine.

    A cached measurement taken while the machine was busy (other processes: load average per core above
    ``BUSY_LOAD``) is taken again once the machine is quiet or clearly quieter than it was then (``QUIETER``);
    ``refresh`` re-measures."""
    cores = host_cores()
    cpu = host_cpu_name()
    key = f"{cpu}|{cores}|numpy{np.__version__}"
    path = cache_dir("devices") / "host.json"
    data = None
    if path.exists() and not refresh:
        try:
            data = json.loads(path.read_text())
            if data.get("key") != key:
                data = None
            else:
                # a measurement without a recorded load predates this rule: taken as busy
                then = float(data.get("load_per_core", BUSY_LOAD + 1))
                now = _load_per_core(cores)
                if then > BUSY_LOAD and (now <= BUSY_LOAD or now < then - QUIETER):
                    data = None
        except (json.JSONDecodeError, OSError, ValueError):
            data = None
    if data is None:
        load = _load_per_core(cores)
        bw = {t: stream_read_gbs(t) for t in sorted({1, cores})}
        data = {
            "key": key,
            "cpu": cpu,
            "cores": cores,
            "stream_read_gbs": bw,
            "gemm_fp32_gflops": _gemm_gflops(),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "load_per_core": round(max(load, _load_per_core(cores)), 3),
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    bw_all = max(float(v) for v in data["stream_read_gbs"].values())
    busy = data["load_per_core"] > BUSY_LOAD
    how = (
        f"measured (micro-benchmark on this host, {data['measured_at']}, load {data['load_per_core']:.2f} per core"
        + ("; the machine was busy: bandwidth and FLOP/s are understated" if busy else "")
        + ")"
    )
    return DeviceProfile(
        "host",
        f"{cpu} ({cores} cores)",
        "cpu",
        {"fp32": data["gemm_fp32_gflops"] * 1e9},
        bw_all * GB,
        None,
        how,
        {
            "peak_flops": "numpy float32 GEMM 1536^3, best of 3",
            "mem_bw": f"numba prange streaming sum over 256 MiB, best of 5; by threads: {data['stream_read_gbs']} GB/s",
        },
    )


def get_profile(name: str) -> DeviceProfile:
    """A device profile by key or alias: host (this CPU, measured), 780m, npu1, hawkpoint, 890m, npu2, h100,
    h200; ValueError for any other name."""
    key = ALIASES.get(name.lower(), name.lower())
    if key == "host":
        return host_profile()
    try:
        return PUBLISHED[key]
    except KeyError:
        known = ", ".join(["host", *PUBLISHED])
        raise ValueError(f"unknown device {name!r} (known: {known})") from None


def profile_or_unknown(name: str) -> DeviceProfile:
    """:func:`get_profile`, or :data:`UNKNOWN` (no peaks) for a device the table lacks: what the profiler rows
    of a run on such a device are computed against."""
    try:
        return get_profile(name)
    except ValueError:
        return UNKNOWN


def all_profiles(include_host: bool = True) -> list[DeviceProfile]:
    return ([host_profile()] if include_host else []) + list(PUBLISHED.values())
