"""The real NPU runtime path: XRT through ``pyxrt``, and detection of an NPU on this machine.

A design built by ``mlir/build.py`` (``final.xclbin`` + ``insts.bin``) runs as mlir-aie's host code does:
open the device, register the xclbin, create a hardware context, get the ``MLIR_AIE`` kernel, allocate an
instruction buffer and host-only data buffers, sync inputs to the device, launch with opcode 3, wait,
sync outputs back. Only :class:`XrtKernel` results are ever labeled as run on an NPU, and only pyxrt
produces them. ``pyxrt`` is not on PyPI: it comes with XRT built from amd/xdna-driver. Whole graphs run
through it in :mod:`workbench.backends.npu.xrt_ops` (``--backend npu --tune mode=xrt``).

Untested on hardware: no NPU or XRT was available where this was written; the call sequence follows
mlir-aie's test utilities and is checked against a stand-in for pyxrt (``tests/fake_pyxrt.py``).
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..base import BackendUnavailableError

OPCODE = 3  # mlir-aie's "run the instruction stream" opcode
INSTR_GROUP, FIRST_DATA_GROUP = 1, 3  # kernel argument groups: instructions, then data buffers
PYXRT_HELP = (
    "pyxrt is not importable: install XRT and the amdxdna driver from https://github.com/amd/xdna-driver "
    "(it provides pyxrt), then `source /opt/xilinx/xrt/setup.sh`"
)


@dataclass
class NpuDetection:
    """What this machine offers for running NPU designs."""

    accel_nodes: list[str] = field(default_factory=list)
    driver_loaded: bool = False
    xrt_smi: str | None = None
    xrt_devices: list[str] = field(default_factory=list)
    pyxrt: bool = False
    pyxrt_error: str = ""

    @property
    def npu_present(self) -> bool:
        return bool(self.accel_nodes) or bool(self.xrt_devices)

    @property
    def can_run(self) -> bool:
        return self.npu_present and self.pyxrt

    def reason(self) -> str:
        if self.can_run:
            return ""
        missing = []
        if not self.npu_present:
            missing.append("no NPU found (no /dev/accel/accel* node, xrt-smi lists no device)")
        if not self.pyxrt:
            missing.append(PYXRT_HELP)
        return "; ".join(missing)

    def to_dict(self) -> dict[str, Any]:
        return {
            "npu_present": self.npu_present,
            "accel_nodes": self.accel_nodes,
            "amdxdna_driver": self.driver_loaded,
            "xrt_smi": self.xrt_smi,
            "xrt_devices": self.xrt_devices,
            "pyxrt": self.pyxrt,
            "reason": self.reason(),
        }


def parse_xrt_smi(text: str) -> list[str]:
    """Device lines of ``xrt-smi examine`` output (BDF in brackets followed by the device name)."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("[") and "]" in s and ":" in s.split("]")[0]:
            out.append(s)
    return out


def detect(root: Path = Path("/"), run_smi: bool = True) -> NpuDetection:
    """Look for an NPU: ``/dev/accel`` nodes, the amdxdna kernel module, ``xrt-smi examine``, ``pyxrt``."""
    d = NpuDetection()
    accel = root / "dev" / "accel"
    d.accel_nodes = sorted(str(p) for p in accel.glob("accel*")) if accel.is_dir() else []
    d.driver_loaded = (root / "sys" / "module" / "amdxdna").exists()
    smi = shutil.which("xrt-smi")
    d.xrt_smi = smi
    if smi and run_smi:
        try:
            res = subprocess.run([smi, "examine"], capture_output=True, text=True, timeout=20)
            d.xrt_devices = parse_xrt_smi(res.stdout)
        except (OSError, subprocess.SubprocessError):
            d.xrt_devices = []
    try:
        importlib.import_module("pyxrt")
        d.pyxrt = True
    except ImportError as e:
        d.pyxrt_error = str(e)
    return d


def read_insts(path: str | Path) -> np.ndarray:
    """The instruction stream of a design: ``insts.bin`` (little-endian uint32) or a text file with one
    hex word per line (``insts.txt``)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"instruction file {p} does not exist (build the design with mlir/build.py)")
    if p.suffix == ".txt":
        words = []
        for n, line in enumerate(p.read_text().splitlines(), 1):
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            try:
                words.append(int(s, 16))
            except ValueError:
                raise ValueError(f"{p}:{n}: {s!r} is not a hex instruction word") from None
        arr = np.array(words, dtype=np.uint32)
    else:
        raw = p.read_bytes()
        if len(raw) % 4:
            raise ValueError(f"{p}: {len(raw)} bytes is not a whole number of 32-bit instruction words")
        arr = np.frombuffer(raw, dtype="<u4").astype(np.uint32)
    if arr.size == 0:
        raise ValueError(f"{p}: empty instruction stream")
    return arr


def _pyxrt():
    try:
        return importlib.import_module("pyxrt")
    except ImportError:
        raise BackendUnavailableError(PYXRT_HELP) from None


class XrtKernel:
    """One built design, loaded on the NPU: ``run(*inputs)`` returns its outputs and the measured time."""

    def __init__(
        self, xclbin: str | Path, insts: str | Path, kernel_name: str = "MLIR_AIE", device_index: int = 0
    ):
        xrt = _pyxrt()
        xclbin, self.insts = Path(xclbin), read_insts(insts)
        if not xclbin.exists():
            raise FileNotFoundError(f"xclbin {xclbin} does not exist (build the design with mlir/build.py)")
        self.xrt = xrt
        self.device = xrt.device(device_index)
        self.xclbin = xrt.xclbin(str(xclbin))
        self.device.register_xclbin(self.xclbin)
        self.context = xrt.hw_context(self.device, self.xclbin.get_uuid())
        self.kernel = xrt.kernel(self.context, kernel_name)
        self.instr_bo = xrt.bo(
            self.device, self.insts.nbytes, xrt.bo.flags.cacheable, self.kernel.group_id(INSTR_GROUP)
        )
        self.instr_bo.write(self.insts.tobytes(), 0)
        self.instr_bo.sync(xrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)
        self._resident_bos: dict[tuple[int, int], tuple[Any, np.ndarray]] = {}

    def _buffer(self, nbytes: int, index: int):
        flags = self.xrt.bo.flags.host_only
        return self.xrt.bo(self.device, nbytes, flags, self.kernel.group_id(FIRST_DATA_GROUP + index))

    def run(
        self,
        inputs: list[np.ndarray],
        outputs: list[tuple[tuple[int, ...], np.dtype]],
        resident: tuple[int, ...] = (),
    ) -> tuple[list[np.ndarray], float]:
        """Copy ``inputs`` in, launch, wait, copy the ``outputs`` (shape, dtype) back. Returns the arrays and
        the measured seconds of sync + launch + wait (``measured on the NPU via pyxrt``). Inputs at the
        indices in ``resident`` (weights) get a buffer of their own, written and synced once per array and
        reused whenever the same array comes again (the time of that first copy is not measured)."""
        xrt = self.xrt
        to_device = xrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
        bos = [
            self._resident(a, i) if i in resident else self._buffer(a.nbytes, i) for i, a in enumerate(inputs)
        ]
        out_bos = [
            self._buffer(int(np.prod(shape)) * np.dtype(dt).itemsize, len(inputs) + j)
            for j, (shape, dt) in enumerate(outputs)
        ]
        t0 = time.perf_counter()
        for i, (bo, a) in enumerate(zip(bos, inputs)):
            if i not in resident:
                bo.write(np.ascontiguousarray(a).tobytes(), 0)
                bo.sync(to_device)
        state = self.kernel(OPCODE, self.instr_bo, len(self.insts), *bos, *out_bos).wait()
        if state != xrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED:
            raise RuntimeError(f"NPU kernel run did not complete: {state}")
        results = []
        for bo, (shape, dt) in zip(out_bos, outputs):
            bo.sync(xrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE)
            nbytes = int(np.prod(shape)) * np.dtype(dt).itemsize
            results.append(np.frombuffer(bytes(bo.read(nbytes, 0)), dtype=dt).reshape(shape).copy())
        return results, time.perf_counter() - t0

    def _resident(self, a: np.ndarray, index: int):
        """The buffer holding array ``a`` (argument ``index``), written and synced the first time."""
        key = (index, id(a))
        held = self._resident_bos.get(key)
        if held is None:
            bo = self._buffer(a.nbytes, index)
            bo.write(np.ascontiguousarray(a).tobytes(), 0)
            bo.sync(self.xrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)
            held = self._resident_bos[key] = (bo, a)  # the array is kept, so its id stays its own
        return held[0]
