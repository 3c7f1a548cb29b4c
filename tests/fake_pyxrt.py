"""A test double for ``pyxrt`` (XRT's Python bindings), for tests only: no NPU exists here.

:class:`FakeXrt` builds a module with the pyxrt calls :class:`workbench.backends.npu.xrt.XrtKernel` makes
(device, xclbin, register_xclbin, hw_context, kernel, bo, sync, launch, wait), records each call, and runs
a launched design the way its IRON runtime sequence describes it: the input buffers are read back into
arrays here, with loops written from the designs (independently of workbench's packers), the emulator's
functional kernel computes, and the result is written into the output buffer in the design's layout. A
design is known by its xclbin path (:meth:`FakeXrt.register`, done where the test "builds" it).
Tests install it with ``monkeypatch.setitem(sys.modules, "pyxrt", fake.module())``.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workbench.backends.npu.arch import get_array
from workbench.backends.npu.designs import XCLBIN_MAGIC
from workbench.backends.npu.emulator import kernels as emu
from workbench.backends.npu.emulator.numerics import to_bf16
from workbench.backends.npu.schedule import Schedule


def bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bits(x: np.ndarray) -> np.ndarray:
    return (to_bf16(x).view(np.uint32) >> 16).astype(np.uint16)


@dataclass
class Design:
    schedule: Schedule
    eps: float  # the NORM_EPS / SCALE defines its kernels were "built" with
    scale: float


def _column_tiles(buf: np.ndarray, n_pad: int, K: int, block: int, cols: int, k: int, mac=None):
    """The weight (n_pad x K) from a pretiled buffer: column c streams its blocks g * cols + c, each as K / k
    tiles of block x k. ``mac`` = (s, t): int8 GEMM tiles, each in mm_i8.cc's order (s x t blocks of the
    MAC tile, row-major, k-blocks of an n-block in order) followed by the int32 SRS shift; returns the
    weight and the shift then."""
    w = np.zeros((n_pad, K), buf.dtype)
    shifts, pos = set(), 0
    for c in range(cols):
        for g in range(n_pad // (block * cols)):
            r0 = (g * cols + c) * block
            for k0 in range(0, K, k):
                tile = buf[pos : pos + block * k]
                pos += block * k
                if mac:
                    s, t = mac
                    tile = tile.reshape(block // t, k // s, s, t).transpose(0, 3, 1, 2)
                    shifts.add(int(buf[pos : pos + 4].copy().view("<i4")[0]))
                    pos += 4
                w[r0 : r0 + block, k0 : k0 + k] = tile.reshape(block, k)
    assert pos == buf.size
    if mac:
        assert len(shifts) == 1, shifts  # one weight, one shift
        return w, shifts.pop()
    return w


def run_design(d: Design, inputs: list[bytes], out_size: int) -> bytes:
    """What the NPU would leave in the output buffer after running design ``d`` on ``inputs``."""
    s, a = d.schedule, get_array(d.schedule.device)
    t, p = s.tile, s.problem
    if s.op in ("gemv", "gemm"):
        K = p["K"]
        i8 = s.dtype_in == "i8"
        wbuf, xbuf = (inputs[0], inputs[1]) if s.op == "gemv" else (inputs[1], inputs[0])
        raw_w = np.frombuffer(wbuf, np.int8 if i8 else np.uint16)
        block = t["m"] * s.rows if s.op == "gemv" else t["n"]
        x = np.frombuffer(xbuf, np.int8 if i8 else np.uint16).reshape(-1, K)
        if i8:  # the kernel shifts by what rides behind the B tiles
            w, shift = _column_tiles(raw_w, t["N_pad"], K, block, s.columns, t["k"], (t["s"], t["t"]))
            out = emu.matmul_i8_acc(s, a, x, w, shift)
        else:
            w = _column_tiles(raw_w, t["N_pad"], K, block, s.columns, t["k"])
            out = emu.matmul_bf16(s, a, bits_to_f32(x), bits_to_f32(w))
    elif s.op == "rmsnorm":
        L = p["L"]
        x = bits_to_f32(np.frombuffer(inputs[0], np.uint16)).reshape(-1, L)
        w = bits_to_f32(np.frombuffer(inputs[1], np.uint16))
        out = np.zeros(x.shape, np.uint16)
        out[: p["R"]] = f32_to_bits(emu.rmsnorm(s, a, x[: p["R"]], w, d.eps, None))
    else:
        out = _attention(d, a, inputs)
    data = np.ascontiguousarray(out).tobytes()
    assert len(data) == out_size, (s.op, len(data), out_size)
    return data


def _attention(d: Design, a, inputs: list[bytes]) -> np.ndarray:
    s, p, t = d.schedule, d.schedule.problem, d.schedule.tile
    nkv, dh = p["n_kv_heads"], p["head_dim"]
    g = p["n_heads"] // nkv
    q_tile, chunk, splits = t["q_tile"], t["kv_chunk"], t["splits"]
    q_tiles, chunks = -(-p["T"] // q_tile), s.notes["chunks_per_item"]
    qbuf, kvbuf = np.frombuffer(inputs[0], np.uint16), np.frombuffer(inputs[1], np.uint16)
    q = np.zeros((q_tiles * q_tile, nkv, g * dh), np.float32)
    q_pos = np.zeros(q_tiles * q_tile, np.int32)
    pos = 0
    for h in range(nkv):  # one object per (KV head, query tile): rows token-major, then int32 positions
        for qt in range(q_tiles):
            rows = slice(qt * q_tile, (qt + 1) * q_tile)
            q[rows, h] = bits_to_f32(qbuf[pos : pos + q_tile * g * dh]).reshape(q_tile, g * dh)
            pos += q_tile * g * dh
            q_pos[rows] = qbuf[pos : pos + 2 * q_tile].copy().view(np.int32)
            pos += 2 * q_tile
    slots = splits * chunks * chunk
    keys, values = (np.zeros((slots, nkv, dh), np.float32) for _ in range(2))
    k_pos = np.zeros(slots, np.int32)
    pos = 0
    for h in range(nkv):  # per (KV head, split) its chunks: keys, int32 positions, values
        for sp in range(splits):
            for ch in range(chunks):
                idx = slice((sp * chunks + ch) * chunk, (sp * chunks + ch + 1) * chunk)
                keys[idx, h] = bits_to_f32(kvbuf[pos : pos + chunk * dh]).reshape(chunk, dh)
                pos += chunk * dh
                k_pos[idx] = kvbuf[pos : pos + 2 * chunk].copy().view(np.int32)
                pos += 2 * chunk
                values[idx, h] = bits_to_f32(kvbuf[pos : pos + chunk * dh]).reshape(chunk, dh)
                pos += chunk * dh
    T, S = p["T"], p["S"]
    ms, ls, accs = emu.attention_states(
        s, a, q[:T].reshape(T, -1), keys[:S].reshape(S, -1), values[:S].reshape(S, -1), q_pos[:T],
        k_pos[:S], d.scale,
    )  # fmt: skip
    out = np.zeros((nkv, q_tiles, splits, q_tile * g, dh + 2), np.float32)
    out[..., dh] = -np.inf
    for sp in range(splits):  # state per (KV head, query tile, split): rows (token, head of the group)
        for h in range(nkv):
            for tok in range(T):
                qt, r = divmod(tok, q_tile)
                rows = slice(r * g, (r + 1) * g)
                out[h, qt, sp, rows, :dh] = accs[sp][tok, h]
                out[h, qt, sp, rows, dh] = ms[sp][tok, h]
                out[h, qt, sp, rows, dh + 1] = ls[sp][tok, h]
    return out


@dataclass
class FakeXrt:
    """The recorder and the designs it can run (see the module docstring)."""

    calls: list = field(default_factory=list)
    designs: dict[str, Design] = field(default_factory=dict)
    state: str = "completed"

    def register(self, xclbin: Path, schedule: Schedule, eps: float, scale: float) -> None:
        self.designs[str(xclbin)] = Design(schedule, eps, scale)

    def module(self) -> types.ModuleType:
        fake, m = self, types.ModuleType("pyxrt")

        class BO:
            class flags:
                host_only, cacheable = "host_only", "cacheable"

            def __init__(self, dev, size, flags, group):
                self.data = bytearray(size)
                fake.calls.append(("bo", size, flags, group))

            def write(self, data, offset):
                self.data[offset : offset + len(data)] = data

            def read(self, n, offset):
                return self.data[offset : offset + n]

            def sync(self, direction):
                fake.calls.append(("sync", direction))

        class Run:
            def wait(self):
                fake.calls.append(("wait",))
                return fake.state

        class XclBin:
            def __init__(self, path):
                with open(path, "rb") as f:
                    if f.read(len(XCLBIN_MAGIC)) != XCLBIN_MAGIC:
                        raise RuntimeError(f"{path}: not a valid xclbin")
                self.path = str(path)

            def get_uuid(self):
                return self.path

        class Kernel:
            def __init__(self, ctx, name):
                self.design = fake.designs[ctx]
                fake.calls.append(("kernel", name, ctx))

            def group_id(self, i):
                return i

            def __call__(self, opcode, instr, n, *bos):
                fake.calls.append(("launch", opcode, n, len(bos), self.design.schedule.op))
                *ins, out = bos
                out.data[:] = run_design(self.design, [bytes(b.data) for b in ins], len(out.data))
                return Run()

        m.ert_cmd_state = types.SimpleNamespace(ERT_CMD_STATE_COMPLETED="completed")
        m.bo, m.kernel, m.xclbin = BO, Kernel, XclBin
        m.device = lambda i: (
            fake.calls.append(("device", i))
            or types.SimpleNamespace(register_xclbin=lambda x: fake.calls.append(("register_xclbin", x.path)))
        )
        m.hw_context = lambda dev, uuid: fake.calls.append(("hw_context", uuid)) or uuid
        m.xclBOSyncDirection = types.SimpleNamespace(
            XCL_BO_SYNC_BO_TO_DEVICE="to", XCL_BO_SYNC_BO_FROM_DEVICE="from"
        )
        return m
