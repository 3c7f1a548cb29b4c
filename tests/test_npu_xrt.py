"""The XRT runtime path's host-side logic (no NPU here: pyxrt is replaced by tests/fake_pyxrt.py)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from fake_pyxrt import FakeXrt

from workbench.backends.base import BackendUnavailableError
from workbench.backends.npu import hostside, xrt
from workbench.backends.npu.arch import get_array
from workbench.backends.npu.designs import XCLBIN_MAGIC
from workbench.backends.npu.emulator import kernels as emu
from workbench.backends.npu.schedule import plan_rowwise

RNG = np.random.default_rng(0)


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


def _rmsnorm_kernel(tmp_path, monkeypatch):
    """A 2 x 64 rmsnorm design's files and an XrtKernel of them on the test-only pyxrt stand-in:
    (the stand-in, the schedule, the kernel)."""
    fake = FakeXrt()
    monkeypatch.setitem(sys.modules, "pyxrt", fake.module())
    s = plan_rowwise(get_array("npu1"), "rmsnorm", 2, 64)
    (tmp_path / "final.xclbin").write_bytes(XCLBIN_MAGIC)
    (tmp_path / "insts.bin").write_bytes(np.arange(4, dtype="<u4").tobytes())
    fake.register(tmp_path / "final.xclbin", s, 1e-6, 1.0)
    return fake, s, xrt.XrtKernel(tmp_path / "final.xclbin", tmp_path / "insts.bin")


def test_xrt_kernel_follows_the_pyxrt_sequence(tmp_path, monkeypatch):
    fake, s, k = _rmsnorm_kernel(tmp_path, monkeypatch)
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    w = np.ones(64, np.float32)
    rows = hostside.rowwise_rows(s) * 64
    (out,), seconds = k.run([hostside.pack_rows(s, x), hostside.bf16_bits(w)], [((rows,), np.uint16)])
    assert seconds >= 0
    assert np.array_equal(
        hostside.unpack_rows(s, out, 2), emu.rmsnorm(s, get_array("npu1"), x, w, 1e-6, None)
    )
    names = [c[0] for c in fake.calls]
    assert names[:4] == ["device", "register_xclbin", "hw_context", "kernel"]
    assert ("bo", 16, "cacheable", 1) in fake.calls  # instructions in group 1
    data_bos = [c for c in fake.calls if c[0] == "bo" and c[2] == "host_only"]
    assert [c[3] for c in data_bos] == [3, 4, 5]  # inputs, then the output, from group 3
    launch = next(c for c in fake.calls if c[0] == "launch")
    assert launch[:4] == ("launch", 3, 4, 3)  # opcode 3, instruction count, 3 data buffers
    assert names.index("wait") > names.index("launch")
    assert fake.calls[-1] == ("sync", "from")
    fake.state = "error"
    with pytest.raises(RuntimeError, match="did not complete: error"):
        k.run([hostside.pack_rows(s, x), hostside.bf16_bits(w)], [((rows,), np.uint16)])


def test_npu_backend_xrt_mode_says_what_is_missing(tmp_path):
    from tiny import write_tiny_gguf

    import workbench as wb

    model = wb.load(str(write_tiny_gguf(tmp_path / "t.gguf")))
    with pytest.raises(BackendUnavailableError, match="mode=xrt"):
        wb.Engine(model, "npu", tune="mode=xrt")


def test_resident_inputs_are_copied_once_per_array(tmp_path, monkeypatch):
    """A weight passed as resident gets its own buffer, written once; a new array gets another one."""
    fake, s, k = _rmsnorm_kernel(tmp_path, monkeypatch)
    x = hostside.pack_rows(s, RNG.standard_normal((2, 64)))
    w1, w2 = hostside.bf16_bits(np.ones(64)), hostside.bf16_bits(np.full(64, 2.0))
    rows = [((hostside.rowwise_rows(s) * 64,), np.uint16)]

    def weight_bos() -> list:
        return [c for c in fake.calls if c[0] == "bo" and c[1] == w1.nbytes and c[3] == 4]

    first = k.run([x, w1], rows, resident=(1,))[0][0]
    assert len(weight_bos()) == 1
    again = k.run([x, w1], rows, resident=(1,))[0][0]
    assert len(weight_bos()) == 1 and np.array_equal(first, again)
    other = k.run([x, w2], rows, resident=(1,))[0][0]
    assert len(weight_bos()) == 2
    assert np.allclose(hostside.unpack_rows(s, other, 2), 2 * hostside.unpack_rows(s, first, 2), rtol=1e-2)
