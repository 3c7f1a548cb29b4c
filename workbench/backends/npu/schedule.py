"""One schedule description per NPU op: tiles, columns and cores, object FIFOs, DMA access patterns, dtypes.

A :class:`~workbench.backends.npu.dataflow.Schedule` (defined in :mod:`workbench.backends.npu.dataflow`,
planned here) is the single source of both the IRON design (:mod:`workbench.backends.npu.iron`)
and the emulator (:mod:`workbench.backends.npu.emulator`), so they cannot drift apart. Planners pick
tile sizes that fit the cores' and memory tiles' memories (checked by :meth:`Schedule.check`) and, among
those, the fastest under the cost model.

Ops: ``gemm`` (activations x weights, several rows), ``gemv`` (one row: decode), ``rmsnorm`` and
``attention`` (queries over a KV cache, split over the keys flash-decoding style).
"""

from __future__ import annotations

import math
from functools import lru_cache

from .arch import DTYPE_BYTES, AieArray
from .cost import estimate
from .dataflow import DdrTransfer, Fifo, Schedule, ScheduleError

OPS = ("gemm", "gemv", "rmsnorm", "attention")
# accumulator / output dtype of each input dtype (bf16 -> fp32; int8 -> int32 acc, shift-round-saturate to int16)
OUT_DTYPE = {"bf16": "f32", "i8": "i16", "i16": "i32"}
# How many MAC tiles (r, s, t) mm.cc's kernels expand per inner step, in m and in n: its static_asserts
# need m % (em * r) == 0 and n % (en * t) == 0. Recent mlir-aie aie2 (npu1) mm.cc: int8 4 x 2
# (matmul_vectorized_4x2_mmul: m % 16, n % 16), bf16 4 x 4 (m % 16, n % 16), i16 2 x 2 (m % 8, n % 8);
# aie2p (npu2) mm.cc: 2 x 2 for every dtype. Older releases expand 2 x 2 everywhere, which these
# multiples also satisfy. int8 GEMMs run our mlir/kernels/mm_i8.cc, which expands as these entries say
# (build.py passes them as EXPAND_M / EXPAND_N): the int8 tiles are those mm.cc's would be.
MM_EXPAND: dict[tuple[str, str], tuple[int, int]] = {
    ("npu1", "i8"): (4, 2),
    ("npu1", "bf16"): (4, 4),
    ("npu1", "i16"): (2, 2),
    ("npu2", "i8"): (2, 2),
    ("npu2", "bf16"): (2, 2),
    ("npu2", "i16"): (2, 2),
}
# int8 GEMM (mlir/kernels/mm_i8.cc): each B tile carries the weight's int32 SRS shift behind its k x n values
SHIFT_BYTES = 4
# RMSNorm kernel (mlir/kernels/rmsnorm.cc): bf16 x bf16 -> fp32 element-wise MACs of this many lanes
NORM_LANES = 16
# vector instructions per element of a row-wise op, over VECTOR_LANES_F32 lanes: RMSNorm per 16 values one
# MAC for the squares, then two MACs, two conversions to bf16 and the weight multiply
ROWWISE_OPS_PER_ELEM = {"rmsnorm": 6}
# keys per attention chunk at most (mlir/kernels/attention.cc keeps one score per key of a chunk)
MAX_KV_CHUNK = 64


def ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


def pos_slots(n: int, dtype: str) -> int:
    """Elements of ``dtype`` that ``n`` int32 positions take behind the data of an object."""
    return n * DTYPE_BYTES["i32"] // DTYPE_BYTES[dtype]


# -- planners ----------------------------------------------------------------------------------------
def _best(candidates: list[Schedule], array: AieArray, what: str) -> Schedule:
    fitting, errors = [], []
    for s in candidates:
        try:
            s.check(array)
            fitting.append(s)
        except ScheduleError as e:
            errors.append(str(e))
    if not fitting:
        raise ScheduleError(
            f"no {what} schedule fits {array.key}: " + (errors[-1] if errors else "no candidates")
        )
    return min(fitting, key=lambda s: estimate(s, array).seconds)


def mm_multiples(array: AieArray, dtype: str) -> tuple[int, int]:
    """What m and n of a GEMM tile must be multiples of for its kernel on ``array`` (:data:`MM_EXPAND`)."""
    r, _, t = array.mac_tile(dtype)
    em, en = MM_EXPAND[array.generation, dtype]
    return em * r, en * t


def _mm_dims(r: int, s: int, t: int, m: int, k: int, n: int, b_col_maj: bool):
    a = ((m // r, r * k), (k // s, s), (r, k), (s, 1))
    b = (
        ((n // t, t * k), (k // s, s), (t, k), (s, 1))
        if b_col_maj
        else ((k // s, s * n), (n // t, t), (s, n), (t, 1))
    )
    c = ((m // r, r * n), (r, t), (n // t, r * t), (t, 1))
    return a, b, c


def gemm_schedule(
    array: AieArray,
    M: int,
    K: int,
    N: int,
    dtype: str,
    m: int,
    k: int,
    n: int,
    columns: int,
    rows: int,
    dtype_out: str | None = None,
    b_col_maj: bool = True,
    depth: int = 2,
    pretiled_b: bool = False,
) -> Schedule:
    """C (M x N) = A (M x K) @ B (K x N), whole-array style: A tiles broadcast along a row of cores, B
    tiles along a column; each core accumulates m x n tiles over K in steps of k. ``b_col_maj``: B is
    stored as N x K (our weights), so a B tile's contiguous runs are k long; ``pretiled_b``: B (a weight)
    was repacked at load time in tile order, so every B tile is one contiguous run.

    bf16 and i16 run mlir-aie's ``mm.cc`` (C accumulated in the output type). i8 runs our
    ``mlir/kernels/mm_i8.cc``: int32 partial sums in a core buffer of m x n (scratch) across all k-steps,
    one shift-round-saturate to int16 at the last; B pretiled on the host in the kernel's MAC-tile order
    (no memory-tile transform) with the weight's int32 shift behind each tile (:data:`SHIFT_BYTES`)."""
    r, s, t = array.mac_tile(dtype)
    mr, nt = mm_multiples(array, dtype)
    out = dtype_out or OUT_DTYPE[dtype]
    if m % mr or k % s or n % nt:
        em, en = MM_EXPAND[array.generation, dtype]
        raise ScheduleError(
            f"gemm tile {m}x{k}x{n}: the {array.generation} kernel expands the {dtype} MAC tile {r}x{s}x{t} "
            f"{em} x {en} times: m % {mr}, k % {s} and n % {nt} must be 0"
        )
    if K % k:
        raise ScheduleError(f"gemm: K={K} is not a multiple of k={k}")
    if rows > columns:
        raise ScheduleError(
            f"gemm: {rows} core rows on {columns} columns: each row's A stream has its own shim and memory-tile "
            "channels (row r on column r), so rows may not exceed columns (DMA channel limits)"
        )
    i8 = dtype == "i8"
    if i8 and not pretiled_b:
        raise ScheduleError(
            "gemm: int8 B must be pretiled (mm_i8.cc's tile order, its SRS shift behind each tile)"
        )
    mp, np_ = ceil_to(M, m * rows), ceil_to(N, n * columns)
    bi, bo = DTYPE_BYTES[dtype], DTYPE_BYTES[out]
    a_dims, b_dims, c_dims = _mm_dims(r, s, t, m, k, n, b_col_maj)
    b_shape = (k * n + SHIFT_BYTES,) if i8 else (k, n)
    b_obj = math.prod(b_shape) * bi
    fifos = (
        Fifo("A_L3L2", "shim", "memtile", (m, k), dtype, depth),
        Fifo("A_L2L1", "memtile", "core", (m, k), dtype, depth, a_dims, fanout=columns),
        Fifo("B_L3L2", "shim", "memtile", b_shape, dtype, depth),
        Fifo("B_L2L1", "memtile", "core", b_shape, dtype, depth, () if i8 else b_dims, fanout=rows),
        Fifo("C_L1L2", "core", "memtile", (m, n), out, depth),
        Fifo("C_L2L3", "memtile", "shim", (m * rows, n), out, depth, c_dims),
    )
    a_reads, b_reads = np_ // (n * columns), mp // (m * rows)
    transfers = (
        DdrTransfer("A", "in", mp * K * bi * a_reads, k * bi, min(columns, rows), a_reads),
        DdrTransfer(
            "B", "in", np_ // n * (K // k) * b_obj * b_reads, b_obj if pretiled_b else (k if b_col_maj else n) * bi,
            columns, b_reads,
        ),
        DdrTransfer("C", "out", mp * np_ * bo, n * bo, columns),
    )  # fmt: skip
    tiles = (mp // m) * (np_ // n) // (columns * rows)
    kernels = (
        ("matmul_i8_i32", "zero_i32", f"mm_i8_{m}x{k}x{n}.o", "matmul_srs_i8_i16")
        if i8
        else (f"matmul_{dtype}_{out}", f"zero_{out}", f"mm_{m}x{k}x{n}.o")
    )
    return Schedule(
        "gemm", array.key, dtype, out, {"M": M, "K": K, "N": N},
        {"m": m, "k": k, "n": n, "r": r, "s": s, "t": t, "M_pad": mp, "N_pad": np_},
        columns, rows, fifos, transfers, tiles * (K // k), m * k * n, "matrix", 0, kernels,
        scratch_bytes=m * n * DTYPE_BYTES["i32"] if i8 else 0,
        blocks_per_call=(m // (2 * r)) * (n // (2 * t)),
        notes={"b_col_maj": b_col_maj, "pretiled_b": pretiled_b, "tiles_per_core": tiles},
    )  # fmt: skip


@lru_cache(maxsize=4096)
def plan_gemm(array: AieArray, M: int, K: int, N: int, dtype: str = "bf16") -> Schedule:
    s = array.mac_tile(dtype)[1]
    mr, nt = mm_multiples(array, dtype)
    cands = []
    for m in sorted(
        {x for x in (64, 32, 16, 8) if x % mr == 0 and x <= max(mr, ceil_to(M, mr))}, reverse=True
    ):
        for k in (512, 256, 128, 64, 32):
            if K % k or k % s:
                continue
            for n in (64, 32, 16):
                if n % nt:
                    continue
                for cols in sorted({1, 2, array.columns}):
                    for rows in sorted({min(array.rows, -(-M // m)), array.rows if m < M else 1}):
                        if rows > cols:  # one A stream per row, each on its own column's shim
                            continue
                        cands.append(
                            gemm_schedule(array, M, K, N, dtype, m, k, n, cols, rows, pretiled_b=True)
                        )
    return _best(cands, array, f"gemm {M}x{K}x{N} {dtype}")


def gemv_schedule(
    array: AieArray,
    N: int,
    K: int,
    dtype: str,
    m: int,
    k: int,
    columns: int,
    rows: int,
    depth: int = 2,
    pretiled: bool = False,
    vectorized: bool = True,
) -> Schedule:
    """y (N) = W (N x K) @ x (K): each core owns blocks of m output rows. Per column one W stream carries
    the m x k tiles of all its cores to the memory tile, which splits it to them; one x stream (pieces of k)
    is forwarded by the memory tile and broadcast to the column's cores; the cores' y blocks are joined in the
    memory tile into one output stream (mlir-aie's matrix_vector idiom, within the DMA channel limits).
    fp32 (or int32) accumulation.
    Kernels: bf16 runs our ``mlir/kernels/gemv.cc`` (mlir-aie's mv.cc has its bf16 combination commented
    out), i16 mlir-aie's ``matvec_vectorized`` (mv.cc); both take m a multiple of 16 and k of 8 and read W
    tiles transposed at 32-bit granularity: the DMA pattern of ``W_L2L1`` does that. Both issue 32-lane MACs
    (``mac_unit`` "vector": r x s of the MAC tile).
    ``pretiled``: W was repacked at load time in tile order (each m x k tile one contiguous run).
    ``vectorized=False``: mv.cc's ``matvec_scalar`` (i16 only) on the scalar unit, W tiles row-major (what
    mlir-aie's matrix_vector example ran while its vectorized kernel was marked erroneous)."""
    if dtype not in ("bf16", "i16"):
        raise ScheduleError(f"gemv: the GEMV kernels take bf16 or i16, not {dtype} (use a gemm schedule)")
    if dtype == "bf16" and not vectorized:
        raise ScheduleError("gemv: no scalar bf16 GEMV kernel (mv.cc's bf16 combination is commented out)")
    if K % k or m % 16 or k % 8:
        raise ScheduleError(f"gemv: need K % k == 0, m % 16 == 0, k % 8 == 0 (K={K}, m={m}, k={k})")
    out = OUT_DTYPE[dtype]
    cores = columns * rows
    np_ = ceil_to(N, m * cores)
    bi, bo = DTYPE_BYTES[dtype], DTYPE_BYTES[out]
    blocks = np_ // (m * cores)
    w_dims = ((k // 2, 2), (m, k), (2, 1)) if vectorized else ()
    fifos = (
        Fifo("W_L3L2", "shim", "memtile", (m * rows, k), dtype, depth),
        Fifo("W_L2L1", "memtile", "core", (m, k), dtype, depth, w_dims),
        Fifo("x_L3L2", "shim", "memtile", (k,), dtype, depth),
        Fifo("x_L2L1", "memtile", "core", (k,), dtype, depth, fanout=rows),
        Fifo("y_L1L2", "core", "memtile", (m,), out, depth),
        Fifo("y_L2L3", "memtile", "shim", (m * rows,), out, depth),
    )
    transfers = (
        DdrTransfer("W", "in", np_ * K * bi, (m * rows * k if pretiled or k == K else k) * bi, columns),
        DdrTransfer("x", "in", columns * blocks * K * bi, k * bi, columns, columns * blocks),
        DdrTransfer("y", "out", np_ * bo, m * rows * bo, columns),
    )
    kind = "vectorized" if vectorized else "scalar"
    kernels = (
        ("gemv_bf16_f32", "gemv_zero_f32", f"gemv_{m}x{k}.o")
        if dtype == "bf16"
        else (f"matvec_{kind}_{dtype}_{out}", f"zero_{kind}_{out}", f"mv_{m}x{k}.o")
    )
    return Schedule(
        "gemv", array.key, dtype, out, {"N": N, "K": K}, {"m": m, "k": k, "N_pad": np_},
        columns, rows, fifos, transfers, blocks * (K // k), m * k, "vector" if vectorized else "scalar", 0,
        kernels, notes={"blocks_per_core": blocks, "pretiled": pretiled},
    )  # fmt: skip


@lru_cache(maxsize=4096)
def plan_gemv(array: AieArray, N: int, K: int, dtype: str = "bf16") -> Schedule:
    ks = [K // d for d in (1, 2, 4, 8, 16, 32, 64) if K % d == 0 and (K // d) % 32 == 0] or [K]
    cands = [
        gemv_schedule(array, N, K, dtype, m, k, cols, array.rows, pretiled=True)
        for m in (64, 32, 16)  # the vectorized kernels take rows in groups of 16
        for k in ks
        for cols in sorted({1, array.columns})
        if m <= N
    ] or [gemv_schedule(array, N, K, dtype, 16, ks[0], 1, 1)]
    return _best(cands, array, f"gemv {N}x{K} {dtype}")


def matmul_schedule(array: AieArray, rows: int, n_out: int, k_in: int, dtype: str) -> Schedule:
    """GEMV (gemv.cc) for a single bf16 row (decode), GEMM (mm.cc) otherwise: int8 rows pad to the MAC tile."""
    if rows == 1 and dtype != "i8":
        return plan_gemv(array, n_out, k_in, dtype)
    return plan_gemm(array, rows, k_in, n_out, dtype)


def rowwise_schedule(
    array: AieArray, op: str, R: int, L: int, dtype: str, rows_per_call: int, columns: int, with_weight: bool
) -> Schedule:
    """Row-wise ops (RMSNorm): each core takes ``rows_per_call`` rows of length L per call, computes
    in fp32 and writes bf16. Per column one input stream carries the rows of all its cores to the memory
    tile, which splits them, and their outputs are joined there into one output stream; a norm's weight row
    arrives once per launch, broadcast from the shim to the column's cores. RMSNorm runs our
    ``mlir/kernels/rmsnorm.cc`` (rows and length compile-time, L a multiple of :data:`NORM_LANES`)."""
    if op not in ROWWISE_OPS_PER_ELEM:
        raise ScheduleError(f"row-wise op must be one of {sorted(ROWWISE_OPS_PER_ELEM)}, got {op!r}")
    if L % NORM_LANES:
        raise ScheduleError(f"rmsnorm: row length {L} is not a multiple of the kernel's {NORM_LANES} lanes")
    cores = columns * array.rows
    b = DTYPE_BYTES[dtype]
    calls = -(-R // (rows_per_call * cores))
    rows = array.rows
    fifos = [
        Fifo("in_L3L2", "shim", "memtile", (rows * rows_per_call, L), dtype),
        Fifo("in_L2L1", "memtile", "core", (rows_per_call, L), dtype),
        Fifo("out_L1L2", "core", "memtile", (rows_per_call, L), dtype),
        Fifo("out_L2L3", "memtile", "shim", (rows * rows_per_call, L), dtype),
    ]
    transfers = [
        DdrTransfer("in", "in", R * L * b, rows * rows_per_call * L * b, columns),
        DdrTransfer("out", "out", R * L * b, rows * rows_per_call * L * b, columns),
    ]
    if with_weight:
        fifos.append(Fifo("w_L3L1", "shim", "core", (L,), dtype, 1, fanout=array.rows, per_call=False))
        transfers.append(DdrTransfer("w", "in", columns * L * b, L * b, columns, columns))
    kernel = ("rmsnorm_bf16", f"rmsnorm_{rows_per_call}x{L}.o")
    return Schedule(
        op, array.key, dtype, dtype, {"R": R, "L": L}, {"rows_per_call": rows_per_call},
        columns, rows, tuple(fifos), tuple(transfers), calls, 0, "vector",
        ROWWISE_OPS_PER_ELEM[op] * rows_per_call * L, kernel, scratch_bytes=rows_per_call * 4,
    )  # fmt: skip


@lru_cache(maxsize=4096)
def plan_rowwise(array: AieArray, op: str, R: int, L: int, dtype: str = "bf16") -> Schedule:
    if op not in ROWWISE_OPS_PER_ELEM:
        raise ValueError(f"row-wise op must be one of {sorted(ROWWISE_OPS_PER_ELEM)}, got {op!r}")
    per_core = -(-R // array.cores)
    cands = [
        rowwise_schedule(array, op, R, L, dtype, rpc, cols, True)
        for rpc in (1, 2, 4, 8)
        if rpc == 1 or rpc <= per_core
        for cols in sorted({1, array.columns})
    ]
    return _best(cands, array, f"{op} {R}x{L}")


def attention_schedule(
    array: AieArray,
    T: int,
    S: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    q_tile: int,
    kv_chunk: int,
    splits: int,
    dtype: str = "bf16",
    window: int = 0,
    share: str = "q",
) -> Schedule:
    """Attention of T queries over S cached keys. Work items are (KV head, query tile) groups x key splits;
    each streams K and V of its split in chunks of ``kv_chunk`` keys, keeps a running max/sum in fp32
    (scores from bf16 inputs with fp32 accumulation, probabilities rounded to bf16 for P @ V), and the
    partials of the splits are merged (log-sum-exp) at the end. Keys are masked by position inside the
    kernel: a query at position p sees keys at positions k <= p (and k > p - ``window`` on sliding-window
    layers; 0: none). Positions travel as int32 behind the bf16 data: the query tile's after its q rows,
    each chunk's keys after them (:func:`pos_slots` bf16 slots each); padding queries carry -1 and padding
    keys INT32_MAX, so the kernel masks them too.

    Data movement within the DMA channel limits: a column works on one (group, round) at a time, its cores
    on consecutive splits of the group (``splits`` a multiple of the rows used; a round is one such set),
    so the group's query tile is one shim stream broadcast to the column's cores; each chunk's K (with positions) and V travel packed as one
    object, the column's chunks in one shim stream that the memory tile splits to the cores; the cores'
    states are joined in the memory tile into one output stream. ``share="kv"`` (prefill, one key split):
    the column's cores take consecutive query tiles of one KV head instead, so the K|V chunks are one shim
    stream broadcast to them and the query tiles one stream the memory tile splits (K|V is streamed once
    per column round rather than once per query tile)."""
    if share not in ("q", "kv"):
        raise ScheduleError(f"attention: share must be 'q' or 'kv', got {share!r}")
    if kv_chunk > MAX_KV_CHUNK:
        raise ScheduleError(f"attention: kv_chunk {kv_chunk} > {MAX_KV_CHUNK} (attention.cc's score buffer)")
    if window < 0:
        raise ScheduleError(f"attention: window must be >= 0 (0: no sliding window), got {window}")
    group = n_heads // n_kv_heads
    b = DTYPE_BYTES[dtype]
    qrows = q_tile * group
    q_tiles = -(-T // q_tile)
    groups = n_kv_heads * q_tiles
    items = groups * splits
    shared = splits if share == "q" else q_tiles  # what a column's cores take consecutive pieces of
    rows = min(array.rows, shared)
    if shared % rows:
        what = "key splits" if share == "q" else "query tiles"
        raise ScheduleError(f"attention: {shared} {what} are not a multiple of the {rows} core rows used")
    if share == "kv" and splits != 1:
        raise ScheduleError("attention: share='kv' (cores share a K|V stream) takes one key split")
    units = items // rows  # column work units: (group, round of splits) or (KV head, round of query tiles)
    columns = min(array.columns, units)
    keys_per_split = -(-S // splits)
    chunks = -(-keys_per_split // kv_chunk)
    calls = -(-units // columns) * chunks
    q_obj = qrows * head_dim + pos_slots(q_tile, dtype)
    kv_obj = 2 * kv_chunk * head_dim + pos_slots(kv_chunk, dtype)
    o_shape = (qrows, head_dim + 2)
    outs = (
        Fifo("o_L1L2", "core", "memtile", o_shape, "f32", 1, per_call=False),
        Fifo("o_L2L3", "memtile", "shim", (rows * qrows, head_dim + 2), "f32", 1, per_call=False),
    )
    out_t = DdrTransfer(
        "out", "out", items * qrows * (head_dim + 2) * 4, rows * qrows * (head_dim + 2) * 4, columns
    )
    if share == "q":
        # per unit: the group's query tile once (one run, broadcast), the cores' packed K|V chunks (one run
        # per chunk and core) and the cores' states (one run)
        fifos = (
            Fifo("q_L3L1", "shim", "core", (q_obj,), dtype, 1, fanout=rows, per_call=False),
            Fifo("kv_L3L2", "shim", "memtile", (rows * kv_obj,), dtype),
            Fifo("kv_L2L1", "memtile", "core", (kv_obj,), dtype),
            *outs,
        )
        transfers = (
            DdrTransfer("q", "in", units * q_obj * b, q_obj * b, columns, units // groups),
            DdrTransfer("KV", "in", items * chunks * kv_obj * b, kv_obj * b, columns, q_tiles),
            out_t,
        )
    else:
        # per unit: the cores' query tiles (one run), the KV head's K|V chunks once (one run, broadcast)
        fifos = (
            Fifo("q_L3L2", "shim", "memtile", (rows * q_obj,), dtype, 1, per_call=False),
            Fifo("q_L2L1", "memtile", "core", (q_obj,), dtype, 1, per_call=False),
            Fifo("kv_L3L1", "shim", "core", (kv_obj,), dtype, fanout=rows),
            *outs,
        )
        transfers = (
            DdrTransfer("q", "in", items * q_obj * b, rows * q_obj * b, columns),
            DdrTransfer(
                "KV", "in", units * chunks * kv_obj * b, chunks * kv_obj * b, columns, q_tiles // rows
            ),
            out_t,
        )
    scratch = qrows * kv_chunk * 4 + qrows * head_dim * 4  # scores and the fp32 output accumulator
    unit = "matrix" if qrows >= array.mac_tile(dtype)[0] else "vector"
    return Schedule(
        "attention", array.key, dtype, "f32",
        {"T": T, "S": S, "n_heads": n_heads, "n_kv_heads": n_kv_heads, "head_dim": head_dim, "window": window},
        {"q_tile": q_tile, "kv_chunk": kv_chunk, "splits": splits},
        columns, rows, fifos, transfers, calls, 2 * qrows * kv_chunk * head_dim, unit, 10 * qrows * kv_chunk,
        ("attn_init_f32", "attn_chunk_bf16", "attention.o"), scratch_bytes=scratch,
        notes={"work_items": items, "chunks_per_item": chunks, "groups": groups, "units": units, "share": share},
    )  # fmt: skip


@lru_cache(maxsize=4096)
def plan_attention(
    array: AieArray,
    T: int,
    S: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    dtype: str = "bf16",
    window: int = 0,
) -> Schedule:
    cands = []
    for q_tile in sorted({min(T, q) for q in (64, 16, 4, 1)}, reverse=True):
        for chunk in (64, 32, 16, 8):
            # at least a column's rows of splits, so a column's cores can share a query tile (share="q")
            max_split = max(1, min(max(array.rows, array.cores // n_kv_heads), -(-S // chunk)))
            top = max_split - max_split % min(array.rows, max_split)  # a multiple of the rows it uses
            for splits in sorted({1, min(max_split, array.rows), top}):
                cands.append(
                    attention_schedule(
                        array, T, S, n_heads, n_kv_heads, head_dim, q_tile, chunk, splits, dtype, window
                    )
                )
            q_tiles = -(-T // q_tile)
            if q_tiles % min(array.rows, q_tiles) == 0:
                cands.append(
                    attention_schedule(
                        array, T, S, n_heads, n_kv_heads, head_dim, q_tile, chunk, 1, dtype, window, "kv"
                    )
                )
    return _best(cands, array, f"attention T={T} S={S}")
