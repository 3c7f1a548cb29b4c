"""The XRT runtime path's host-side logic (no NPU here: pyxrt is replaced by a recording stand-in)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from workbench.backends.base import BackendUnavailableError
from workbench.backends.npu import xrt


def test_read_insts_bin_and_txt(tmp_path):
    words = np.array([0x06030100, 0x00000105, 0xDEADBEEF], np.uint32)
    (tmp_path / "insts.bin").write_bytes(words.astype("<u4").tobytes())
    assert xrt.read_insts(tmp_path / "insts.bin").tolist() == words.tolist()
    (tmp_path / "insts.txt").write_text("# header\n06030100\n00000105\n\ndeadbeef\n")
    assert xrt.read_insts(tmp_path / "insts.txt").tolist() == words.tolist()


def test_read_insts_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"mlir/build\.py"):
        xrt.read_insts(tmp_path / "missing.bin")
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 6)
    with pytest.raises(ValueError, match="32-bit"):
        xrt.read_insts(tmp_path / "odd.bin")
    (tmp_path / "bad.txt").write_text("0001\nzz\n")
    with pytest.raises(ValueError, match=r"bad.txt:2"):
        xrt.read_insts(tmp_path / "bad.txt")
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        xrt.read_insts(tmp_path / "empty.bin")


def test_detect_finds_accel_nodes_and_driver(tmp_path):
    none = xrt.detect(tmp_path, run_smi=False)
    assert not none.npu_present and "no NPU found" in none.reason()
    (tmp_path / "dev" / "accel").mkdir(parents=True)
    (tmp_path / "dev" / "accel" / "accel0").touch()
    (tmp_path / "sys" / "module" / "amdxdna").mkdir(parents=True)
    d = xrt.detect(tmp_path, run_smi=False)
    assert d.npu_present and d.driver_loaded and d.accel_nodes[0].endswith("accel0")
    if not d.pyxrt:
        assert "pyxrt" in d.reason() and not d.can_run


def test_parse_xrt_smi():
    text = "System Configuration\n...\nDevice(s) Present\n|BDF |Name |\n[0000:c5:00.1]  :  RyzenAI-npu1\n"
    assert xrt.parse_xrt_smi(text) == ["[0000:c5:00.1]  :  RyzenAI-npu1"]


def test_missing_pyxrt_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyxrt", None)  # import fails
    with pytest.raises(BackendUnavailableError, match="xdna-driver"):
        xrt.XrtKernel(tmp_path / "final.xclbin", tmp_path / "insts.bin")


def _fake_pyxrt(calls: list):
    """A stand-in for pyxrt that records the call sequence and echoes input buffers to outputs."""
    m = types.ModuleType("pyxrt")

    class BO:
        class flags:
            host_only, cacheable = "host_only", "cacheable"

        def __init__(self, dev, size, flags, group):
            self.data = bytearray(size)
            calls.append(("bo", size, flags, group))

        def write(self, data, offset):
            self.data[offset : offset + len(data)] = data

        def read(self, n, offset):
            return self.data[offset : offset + n]

        def sync(self, direction):
            calls.append(("sync", direction))

    class Run:
        def wait(self):
            calls.append(("wait",))
            return m.state

    class Kernel:
        def __init__(self, ctx, name):
            calls.append(("kernel", name))

        def group_id(self, i):
            return i

        def __call__(self, opcode, instr, n, *bos):
            calls.append(("launch", opcode, n, len(bos)))
            bos[-1].data[:] = bos[0].data[: len(bos[-1].data)]  # "compute": copy input 0 to the output
            return Run()

    m.ert_cmd_state = types.SimpleNamespace(ERT_CMD_STATE_COMPLETED="completed", ERT_CMD_STATE_ERROR="error")
    m.state = "completed"
    m.bo = BO
    m.kernel = Kernel
    m.device = lambda i: (
        calls.append(("device", i))
        or types.SimpleNamespace(register_xclbin=lambda x: calls.append(("register_xclbin",)))
    )
    m.xclbin = lambda p: types.SimpleNamespace(get_uuid=lambda: "uuid")
    m.hw_context = lambda dev, uuid: calls.append(("hw_context", uuid)) or "ctx"
    m.xclBOSyncDirection = types.SimpleNamespace(
        XCL_BO_SYNC_BO_TO_DEVICE="to", XCL_BO_SYNC_BO_FROM_DEVICE="from"
    )
    return m


def test_xrt_kernel_follows_the_pyxrt_sequence(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "pyxrt", _fake_pyxrt(calls))
    (tmp_path / "final.xclbin").write_bytes(b"x")
    (tmp_path / "insts.bin").write_bytes(np.arange(4, dtype="<u4").tobytes())
    k = xrt.XrtKernel(tmp_path / "final.xclbin", tmp_path / "insts.bin")
    a = np.arange(8, dtype=np.float32)
    (out,), seconds = k.run([a, np.ones(8, np.float32)], [((8,), np.float32)])
    assert np.array_equal(out, a) and seconds >= 0
    names = [c[0] for c in calls]
    assert names[:4] == ["device", "register_xclbin", "hw_context", "kernel"]
    assert ("bo", 16, "cacheable", 1) in calls  # instructions in group 1
    assert next(c for c in calls if c[0] == "bo" and c[2] == "host_only")[3] == 3  # data from group 3
    launch = next(c for c in calls if c[0] == "launch")
    assert launch == ("launch", 3, 4, 3)  # opcode 3, instruction count, 3 data buffers
    assert names.index("wait") > names.index("launch")
    assert calls[-1] == ("sync", "from")
    sys.modules["pyxrt"].state = "error"
    with pytest.raises(RuntimeError, match="did not complete: error"):
        k.run([a], [((8,), np.float32)])


def test_npu_backend_xrt_mode_says_what_is_missing(tmp_path):
    from tiny import write_tiny_gguf

    import workbench as wb

    model = wb.load(str(write_tiny_gguf(tmp_path / "t.gguf")))
    with pytest.raises(BackendUnavailableError, match="mode=xrt"):
        wb.Engine(model, "npu", tune="mode=xrt")
