"""Our AIE kernels (mlir/kernels/*.cc) compiled with the host C++ compiler against a stand-in for the AIE
API (tests/npu_host_aie: scalar loops with the API's documented semantics), with the very defines
mlir/build.py passes for a schedule, run on the data layouts the designs stream and compared with the
emulator. This checks the kernels' loops, indexing, masking and numerics as written; not the AIE
compiler, the real API's code generation or timing (nothing here ran on an NPU)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from npu_helpers import build_module, dma_walk

from workbench.backends.npu import hostside
from workbench.backends.npu.arch import get_array
from workbench.backends.npu.emulator import kernels as emu
from workbench.backends.npu.emulator.numerics import srs_shift, to_bf16
from workbench.backends.npu.hostside import bf16_bits, from_bf16_bits
from workbench.backends.npu.schedule import (
    SHIFT_BYTES,
    attention_schedule,
    gemm_schedule,
    gemv_schedule,
    rowwise_schedule,
)
from workbench.models.config import preset

STAND_IN = Path(__file__).resolve().parent / "npu_host_aie"
CXX = shutil.which("g++") or shutil.which("clang++")
A = get_array("npu1")
CFG = preset("gemma3-270m")
RNG = np.random.default_rng(0)

pytestmark = pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler (g++ or clang++)")


def _compile(tmp_path: Path, schedule, obj: str, n_args: dict[str, int]) -> ctypes.CDLL:
    """Kernel object ``obj`` of ``schedule`` built on the host with build.py's defines; ``n_args``: the
    pointer arguments of each function to call."""
    build = build_module()
    src = build.kernel_source(obj, "aie2p" if schedule.device == "npu2" else "aie2", {})
    lib = tmp_path / (Path(obj).stem + ".so")
    cmd = [CXX, "-std=c++20", "-O1", "-shared", "-fPIC", "-I", str(STAND_IN),
           *build.kernel_defines(obj, schedule, CFG), str(src), "-o", str(lib)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    dll = ctypes.CDLL(str(lib))
    for name, n in n_args.items():
        getattr(dll, name).argtypes = [ctypes.c_void_p] * n
        getattr(dll, name).restype = None
    return dll


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    assert a.flags.c_contiguous
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.parametrize("rows,length,rows_per_call", [(2, 640, 1), (4, 256, 2), (1, 5376, 1)])
def test_rmsnorm_kernel_is_bit_exact_with_the_emulator(tmp_path, rows, length, rows_per_call):
    s = rowwise_schedule(A, "rmsnorm", rows, length, "bf16", rows_per_call, 1, True)
    dll = _compile(tmp_path, s, s.kernels[1], {"rmsnorm_bf16": 3})
    x = (3 * RNG.standard_normal((rows, length))).astype(np.float32)
    w = (1 + 0.1 * RNG.standard_normal(length)).astype(np.float32)
    xb, wb = bf16_bits(x), bf16_bits(w)
    y = np.zeros_like(xb)
    for r in range(0, rows, rows_per_call):  # one call per object of rows_per_call rows
        dll.rmsnorm_bf16(_ptr(xb[r : r + rows_per_call]), _ptr(wb), _ptr(y[r : r + rows_per_call]))
    want = emu.rmsnorm(s, A, x, to_bf16(w), CFG.rms_eps, None)
    assert np.array_equal(from_bf16_bits(y), want)


@pytest.mark.parametrize("m,k", [(16, 8), (32, 256), (64, 128)])
def test_gemv_kernel_on_the_dma_layout_gives_w_times_x(tmp_path, m, k):
    """bf16 GEMV designs call mlir/kernels/gemv.cc on W tiles as the memory tile's W_L2L1 pattern delivers
    them; over two K blocks (zero, then accumulate) it gives the emulator's fp32 W @ x."""
    s = gemv_schedule(A, 4 * m, 2 * k, "bf16", m, k, 1, 4)
    dll = _compile(tmp_path, s, s.kernels[2], {"gemv_bf16_f32": 3, "gemv_zero_f32": 1})
    w = RNG.standard_normal((m, 2 * k)).astype(np.float32)
    x = RNG.standard_normal(2 * k).astype(np.float32)
    dims = next(f for f in s.fifos if f.name == "W_L2L1").dims
    y = np.full(m, np.nan, np.float32)
    dll.gemv_zero_f32(_ptr(y))
    for k0 in (0, k):
        tile = dma_walk(bf16_bits(w[:, k0 : k0 + k]), dims)
        dll.gemv_bf16_f32(_ptr(np.ascontiguousarray(tile)), _ptr(bf16_bits(x[k0 : k0 + k])), _ptr(y))
    want = emu.matmul_bf16(s, A, x[None], to_bf16(w))[0]
    assert np.allclose(y, want, rtol=1e-5, atol=1e-5)


def test_gemv_design_on_the_packed_weight_gives_w_times_x(tmp_path):
    """The W buffer the XRT path packs (hostside.pack_gemv_weight) streamed as the GEMV design streams it:
    column c's slice of tiles, each split by the memory tile into the cores' m-row pieces (offsets m * k *
    r), each piece through the W_L2L1 pattern into gemv.cc; core (c, r) accumulates block b's rows
    ((b * columns + c) * rows + r) * m over the K tiles. The y blocks give W @ x."""
    m, k, cols, rows, blocks = 16, 32, 2, 4, 2
    N, K = m * rows * cols * blocks - 24, 3 * k  # padded rows too
    s = gemv_schedule(A, N, K, "bf16", m, k, cols, rows, pretiled=True)
    dll = _compile(tmp_path, s, s.kernels[2], {"gemv_bf16_f32": 3, "gemv_zero_f32": 1})
    w = RNG.standard_normal((N, K)).astype(np.float32)
    x = RNG.standard_normal(K).astype(np.float32)
    dims = next(f for f in s.fifos if f.name == "W_L2L1").dims
    tiles = hostside.pack_gemv_weight(s, bf16_bits(w)).reshape(cols, blocks, K // k, rows, m * k)
    y = np.full(s.tile["N_pad"], np.nan, np.float32)
    for c in range(cols):
        for b in range(blocks):
            for r in range(rows):
                out = y[((b * cols + c) * rows + r) * m :][:m]
                dll.gemv_zero_f32(_ptr(out))
                for ks in range(K // k):
                    local = np.ascontiguousarray(dma_walk(tiles[c, b, ks, r], dims))
                    dll.gemv_bf16_f32(_ptr(local), _ptr(bf16_bits(x[ks * k : (ks + 1) * k])), _ptr(out))
    want = emu.matmul_bf16(s, A, x[None], to_bf16(w))[0]
    assert np.allclose(hostside.unpack_matmul(s, y, 1)[0], want, rtol=1e-5, atol=1e-5)


def _attention_on_kernel(s, dll, q, keys, values, q_pos, k_pos) -> np.ndarray:
    """The attention design's host side (workbench.backends.npu.hostside: Q and K|V packed as the design
    streams them, per-split states unpacked and merged) around the compiled kernel, run as the design's
    cores do: one state per (KV head, query tile, split), updated chunk by chunk."""
    p, t = s.problem, s.tile
    nkv, d = p["n_kv_heads"], p["head_dim"]
    rows = t["q_tile"] * p["n_heads"] // nkv
    q_tiles, chunks, splits = -(-p["T"] // t["q_tile"]), s.notes["chunks_per_item"], t["splits"]
    q_buf = hostside.pack_attention_q(s, q, q_pos).reshape(nkv, q_tiles, -1)
    kv_buf = hostside.pack_attention_kv(s, keys, values, k_pos).reshape(nkv, splits, chunks, -1)
    out = np.zeros((nkv, q_tiles, splits, rows, d + 2), np.float32)
    for h in range(nkv):
        for qt in range(q_tiles):
            q_obj = np.ascontiguousarray(q_buf[h, qt])
            for sp in range(splits):
                state = out[h, qt, sp]
                dll.attn_init_f32(_ptr(state))
                for c in range(chunks):
                    dll.attn_chunk_bf16(
                        _ptr(q_obj), _ptr(np.ascontiguousarray(kv_buf[h, sp, c])), _ptr(state)
                    )
    states = hostside.unpack_attention_states(s, out.reshape(-1), p["T"])
    return hostside.merge_splits(*states).reshape(p["T"], -1)


@pytest.mark.parametrize("window", [0, 6])
def test_attention_kernel_masks_prefill_tiles_like_the_emulator(tmp_path, window):
    """Prefill query tiles (several queries per work item, keys of the same tile included), keys in
    ring-buffer order, padding queries and keys: the kernel's position masking gives the emulator's
    result; without it (WINDOW and causality ignored) the result differs."""
    T, S, nh, nkv, d = 5, 13, 4, 2, 8
    s = attention_schedule(A, T, S, nh, nkv, d, 2, 4, 2, window=window)
    dll = _compile(tmp_path, s, s.kernels[2], {"attn_init_f32": 1, "attn_chunk_bf16": 3})
    q = RNG.standard_normal((T, nh * d)).astype(np.float32)
    keys = RNG.standard_normal((S, nkv * d)).astype(np.float32)
    values = RNG.standard_normal((S, nkv * d)).astype(np.float32)
    q_pos, k_pos = np.arange(S - T, S), np.roll(np.arange(S), 5)
    got = _attention_on_kernel(s, dll, q, keys, values, q_pos, k_pos)
    want = emu.attention(s, A, q, keys, values, q_pos, k_pos, CFG.attn_scale)
    assert np.abs(got - want).max() < 1e-4
    every_key = attention_schedule(A, T, S, nh, nkv, d, 2, 4, 2)  # no window, and all keys at position 0:
    unmasked = emu.attention(every_key, A, q, keys, values, q_pos, np.zeros(S, int), CFG.attn_scale)
    assert np.abs(got - unmasked).max() > 1e-2  # the mask matters for this data


def _gemm_i8_on_kernel(s, dll, xq: np.ndarray, wq: np.ndarray, shift: int) -> np.ndarray:
    """The int8 GEMM design's data path around the compiled kernel: ``A`` packed (hostside.pack_gemm_rows)
    and cut into m x k tiles that pass the A_L2L1 pattern; ``B`` packed (hostside.pack_gemm_weight: column
    c's tiles in order, the shift behind each); core (c, r) takes row bands r, r + rows, ... and column c's
    n-blocks, per output tile zero_i32, K / k - 1 accumulating calls and the last one with the SRS, its C
    tile through the C_L2L3 pattern into ``C`` (M_pad x N_pad), unpacked as the XRT path does."""
    t, K = s.tile, s.problem["K"]
    m, k, n, steps = t["m"], t["k"], t["n"], K // t["k"]
    dims = {f.name: f.dims for f in s.fifos}
    a_buf = hostside.pack_gemm_rows(s, xq).reshape(t["M_pad"], K)
    b_buf = hostside.pack_gemm_weight(s, wq, shift).reshape(s.columns, -1, steps, k * n + SHIFT_BYTES)
    out = np.zeros((t["M_pad"], t["N_pad"]), np.int16)
    acc = np.zeros(m * n, np.int32)
    for c in range(s.columns):
        for r in range(s.rows):
            for band in range(r, t["M_pad"] // m, s.rows):
                for g in range(b_buf.shape[1]):
                    dll.zero_i32(_ptr(acc))
                    tile = np.zeros(m * n, np.int16)
                    for step in range(steps):
                        a = a_buf[band * m : (band + 1) * m, step * k : (step + 1) * k]
                        a_l1 = np.ascontiguousarray(dma_walk(a, dims["A_L2L1"]))
                        b_l1 = np.ascontiguousarray(b_buf[c, g, step])
                        if step < steps - 1:
                            dll.matmul_i8_i32(_ptr(a_l1), _ptr(b_l1), _ptr(acc))
                        else:
                            dll.matmul_srs_i8_i16(_ptr(a_l1), _ptr(b_l1), _ptr(acc), _ptr(tile))
                    rows, cols = slice(band * m, (band + 1) * m), slice((g * s.columns + c) * n, None)
                    out[rows, cols][:, :n] = dma_walk(tile, dims["C_L2L3"]).reshape(m, n)
    return hostside.unpack_matmul(s, out.reshape(-1), xq.shape[0])


@pytest.mark.parametrize(
    "device,steps,case",
    [("npu1", 3, "partials beyond int16"), ("npu1", 3, "saturating, ties"), ("npu2", 1, "one k-step"),
     ("npu2", 2, "saturating, no shift")],
)  # fmt: skip
def test_int8_gemm_kernel_is_bit_exact_with_the_emulator(tmp_path, device, steps, case):
    """mlir/kernels/mm_i8.cc on the buffers the host packs gives the emulator's int8 GEMM bit for bit: int32
    partial sums over all of K (here partial sums after a k-step that int16 could not hold), one
    shift-round-saturate by the weight's shift with ties rounded to even and results saturated to int16."""
    a = get_array(device)
    M, N, k = 40, 100, 64
    s = gemm_schedule(a, M, steps * k, N, "i8", 16, k, 32, 2, 2, pretiled_b=True)
    dll = _compile(tmp_path, s, s.kernels[2], {"zero_i32": 1, "matmul_i8_i32": 3, "matmul_srs_i8_i16": 4})
    xq = RNG.integers(-127, 128, (M, steps * k)).astype(np.int8)
    wq = RNG.integers(-127, 128, (N, steps * k)).astype(np.int8)
    if case == "partials beyond int16":  # the first k-step's products all +127^2, the second's cancel them
        xq[:, : 2 * k], wq[:, :k], wq[:, k : 2 * k] = 127, 127, -127
    shift = {"saturating, ties": 1, "saturating, no shift": 0}.get(case, srs_shift(wq))
    got = _gemm_i8_on_kernel(s, dll, xq, wq, shift)
    want = emu.matmul_i8_acc(s, a, xq, wq, shift)
    assert got.dtype == want.dtype == np.int16 and np.array_equal(got, want)
    exact = xq.astype(np.int64) @ wq.T.astype(np.int64)
    if case == "partials beyond int16":
        first = xq[:, :k].astype(np.int64) @ wq[:, :k].T.astype(np.int64)
        assert np.abs(first).min() > 2**15 and np.abs(want).max() < 2**15 - 1
    if case.startswith("saturating"):
        assert (want == 2**15 - 1).any() and (want == -(2**15)).any()
    if case == "saturating, ties":
        ties = exact % 2 == 1
        assert ties.any() and not np.array_equal(want[ties], np.clip(exact[ties] >> 1, -(2**15), 2**15 - 1))


def test_int8_gemm_weight_packing_needs_the_shift():
    """The int8 kernel reads its SRS shift from behind each B tile, so packing an int8 weight without one
    (or with one it cannot apply) is refused, and so is a shift for a bf16 weight."""
    s = gemm_schedule(A, 16, 128, 64, "i8", 16, 64, 32, 2, 1, pretiled_b=True)
    wq = RNG.integers(-127, 128, (64, 128)).astype(np.int8)
    for bad in (None, -1, 32):
        with pytest.raises(ValueError, match="SRS shift"):
            hostside.pack_gemm_weight(s, wq, bad)
    packed = hostside.pack_gemm_weight(s, wq, 9).reshape(-1, 64 * 32 + SHIFT_BYTES)
    assert packed.shape[0] == 2 * 2 and (packed[:, -SHIFT_BYTES:].copy().view("<i4") == 9).all()
    bf16 = gemm_schedule(A, 16, 128, 64, "bf16", 16, 64, 32, 2, 1, pretiled_b=True)
    with pytest.raises(ValueError, match="only int8"):
        hostside.pack_gemm_weight(bf16, bf16_bits(wq.astype(np.float32)), 9)
