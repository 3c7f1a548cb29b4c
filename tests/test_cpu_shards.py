"""Decode steps split across threads by heads and hidden units (backends/numba_cpu/shards.py)."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.backends import make_backend
from workbench.backends.base import Step
from workbench.backends.numba_cpu import instructions as ins
from workbench.backends.numba_cpu import matvec as mv
from workbench.backends.numba_cpu import matvec_table as mt
from workbench.backends.numba_cpu import program as pg
from workbench.backends.numba_cpu import shards as sh
from workbench.backends.numba_cpu.simd import Q6_K_I8
from workbench.models.synth import random_blocks
from workbench.numba_jit import numba
from workbench.quant.formats import GGMLType
from workbench.quant.repack import q4_k_to_r16, q5_0_to_r16, q5_0_to_x4, q6_k_to_i8, q8_0_to_r16

FORMATS = {  # layout: GGUF type, its CpuWeight.fmt, repacking, values of a unit
    "Q8_0": (GGMLType.Q8_0, int(GGMLType.Q8_0), None, 32),
    "Q5_0": (GGMLType.Q5_0, int(GGMLType.Q5_0), None, 32),
    "Q4_K": (GGMLType.Q4_K, int(GGMLType.Q4_K), None, 256),
    "Q6_K": (GGMLType.Q6_K, int(GGMLType.Q6_K), None, 256),
    "Q5_0_X4": (GGMLType.Q5_0, mv.Q5_0_X4, q5_0_to_x4, 128),
    "Q6_K_I8": (GGMLType.Q6_K, Q6_K_I8, q6_k_to_i8, 256),
    "Q8_0_R16": (GGMLType.Q8_0, sh.R16_FMTS[0], q8_0_to_r16, 32),
    "Q5_0_R16": (GGMLType.Q5_0, sh.R16_FMTS[1], q5_0_to_r16, 32),
    "Q4_K_R16": (GGMLType.Q4_K, sh.R16_FMTS[2], q4_k_to_r16, 256),
}
LEVELS = [32767, 0] + ([127] if mv.VNNI else [])  # int16, float, int8 (VNNI hosts) activations


def _matvec(row: np.ndarray, x: np.ndarray, levels: int, vnni: bool, prefetch: bool = False) -> np.ndarray:
    """x @ W.T for the weight-table row ``row`` by the shards' one-thread path (``prefetch``: PF_ROWS rows at
    a time, prefetching the lines of ``x`` in between)."""
    out = np.zeros((1, int(row[mv.W_ROWS])), np.float32)
    xq = mv.act_codes(1, x.shape[1], vnni) if levels else np.zeros((1, 1), np.int16)  # float: unused
    xd = np.zeros((1, x.shape[1] // 32), np.float32)
    xs = np.zeros_like(xd)
    pf = np.array([x.ctypes.data, x.ctypes.data, x.nbytes if prefetch else 0], np.int64)
    pg.project(row[None], np.zeros(1, np.int64), 1, x, (out,), levels, xq, xd, xs, 0, mt.NO_MAXIMA, pf, False)
    return out


@pytest.mark.parametrize("layout", sorted(FORMATS))
@pytest.mark.parametrize("levels", LEVELS)
@settings(max_examples=6, deadline=None)
@given(groups=st.integers(1, 5), half_units=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_column_shares_add_up_to_the_whole_projection(layout, levels, groups, half_units, seed):
    """Each shard's columns of a weight (its share of every row's units), times its slice of the activations
    (quantized alone), add up to the whole row's product: the same integer sums, only the float order of
    adding the two halves differs."""
    qtype, fmt, repack, unit_values = FORMATS[layout]
    cols = 2 * half_units * unit_values
    rng = np.random.default_rng(seed)
    raw = random_blocks(qtype, 16 * groups, cols, rng)
    data = repack(raw) if repack else raw
    n_units = cols // unit_values
    row = np.array([fmt, data.ctypes.data, data.shape[1], data.shape[0], n_units], np.int64)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    vnni = levels == 127
    whole = _matvec(row, x, levels, vnni)
    np.testing.assert_array_equal(_matvec(row, x, levels, vnni, prefetch=True), whole)  # rows in runs
    parts = [sh.split_cols(row, data, 2, s, levels) for s in range(2)]
    if fmt in sh.R16_FMTS and levels == 0:
        assert parts == [None, None]  # interleaved float rows are dequantized whole: not split
        return
    half = cols // 2
    total = sum(_matvec(p, np.ascontiguousarray(x[:, s * half : (s + 1) * half]), levels, vnni)
                for s, (p, _) in enumerate(parts))  # fmt: skip
    assert parts[0][1].nbytes + parts[1][1].nbytes == data.nbytes
    np.testing.assert_allclose(total, whole, rtol=0, atol=2e-5 * max(1.0, float(np.abs(whole).max())))


def test_row_shares_are_whole_runs_of_rows():
    row = np.array([sh.R16_FMTS[0], 1000, 34, 64, 1], np.int64)
    got = [sh.split_rows(row, 2, s, 16) for s in range(2)]
    assert [(int(p[mv.W_ADDR]), int(p[mv.W_ROWS]), c0) for p, c0 in got] == [
        (1000, 32, 0),
        (1000 + 32 * 34, 32, 32),
    ]
    assert sh.split_rows(row, 2, 0, 64) is None  # 32 rows a shard: not whole heads of 64
    assert sh.split_rows(row, 4, 0, 16) is not None  # 16 rows a shard: one interleaved group each...
    assert sh.split_rows(row, 8, 0, 1) is None  # ...8 rows a shard cut a group


def _decode(cpu, model, toks, n=3):
    cache = cpu.new_cache(64)
    cpu.run(cpu.prepare_graph(model.graph(len(toks), 1)), Step.single(cache, toks, 0))
    g1 = cpu.prepare_graph(model.graph(1, 1))
    out = [cpu.run(g1, Step.single(cache, [5 + i], len(toks) + i, "last", "decode")) for i in range(n)]
    return g1, np.array(out)


def test_default_model_decodes_in_shards(default_model):
    """The default model's decode body splits into two shards (Q rows, heads, output columns, gate/up rows,
    down columns); the shards' logits differ from the row-parallel program's only by float order (measured
    9.3e-3, logits of magnitude ~20-40), the greedy tokens not at all."""
    toks = default_model.tokenizer.encode("Shards must not change the answer.")
    cpu = make_backend("cpu", default_model, threads=2)
    g1, got = _decode(cpu, default_model, toks)
    plan = cpu._programs[id(g1)][1].shards
    assert plan is not None and plan.n_shards == 2 and plan.threaded
    assert re.fullmatch(r"2, a thread each, \d+\.\d MB of column copies", cpu.device.details["decode_shards"])
    code = cpu._programs[id(g1)][1].code
    kinds = {(int(c["op"]), int(c["mode"])) for c in code[:-1]}
    assert kinds == {
        (ins.EMBED, ins.WHOLE), (ins.NORM_MATMUL, ins.ROWS), (ins.NORM_ROPE, ins.HEADS), (ins.NORM_ROPE, ins.WHOLE),
        (ins.ATTENTION, ins.HEADS), (ins.MATMUL_NORM_ADD, ins.COLS), (ins.NORM_MATMUL_GELU, ins.ROWS),
    }  # fmt: skip
    rows = make_backend("cpu", default_model, threads=2, tune="decode_shards=1")
    g1r, want = _decode(rows, default_model, toks)
    assert rows._programs[id(g1r)][1].shards is None and rows.device.details["decode_shards"] == "off"
    np.testing.assert_allclose(got, want, atol=2e-2, rtol=0)
    assert (got[:, -1].argmax(-1) == want[:, -1].argmax(-1)).all()


def test_shards_that_do_not_divide_the_heads_leave_the_program_whole(default_model):
    cpu = make_backend("cpu", default_model, threads=2, tune="decode_shards=3")  # 4 query heads
    toks = default_model.tokenizer.encode("Three shards")
    g1, _ = _decode(cpu, default_model, toks, 1)
    assert cpu._programs[id(g1)][1].shards is None
    assert cpu.device.details["decode_shards"].startswith("3, unused")
    with pytest.raises(ValueError, match="decode_shards"):
        make_backend("cpu", default_model, tune="decode_shards=0")


def test_shards_whose_column_copies_exceed_their_budget_leave_the_program_whole(default_model):
    cpu = make_backend("cpu", default_model, threads=2, tune="shard_copy_mib=1")  # the 270M's take ~25 MiB
    g1, _ = _decode(cpu, default_model, default_model.tokenizer.encode("Memory"), 1)
    assert cpu._programs[id(g1)][1].shards is None and not cpu.col_shares
    assert re.fullmatch(r"2, unused \(column copies would take \d+ MiB > shard_copy_mib=1\)",
                        cpu.device.details["decode_shards"])  # fmt: skip
    with pytest.raises(ValueError, match="shard_copy_mib"):
        make_backend("cpu", default_model, tune="shard_copy_mib=-1")


def test_shards_not_run_concurrently_fail_clearly(default_model):
    """Shards told they have a thread each but run on one: the first waits at its barrier, gives up after
    SPIN_LIMIT cycles and the step raises (instead of hanging)."""
    cpu = make_backend("cpu", default_model, threads=1)
    toks = default_model.tokenizer.encode("One thread")
    g1, _ = _decode(cpu, default_model, toks, 1)
    prog = cpu._programs[id(g1)][1]
    assert not prog.shards.threaded  # one thread: the shards run in turn
    prog.shards.threaded = True
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="did not run concurrently"):
        cpu.run(g1, Step.single(cpu.new_cache(64), [5], 0, "last", "decode"))
    assert time.perf_counter() - t0 < 60
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


@pytest.mark.parametrize("n_kv", [1, 2])
def test_shards_match_the_reference_past_the_sliding_window(tmp_path, n_kv):
    """A tiny Q8_0 model with one KV head (every shard stores it whole) or two (each shard stores and reads
    its own) and an 8-token window: 24 decode steps past a 4-token prompt wrap the sliding layers' ring
    caches; the shards (one thread and two) match the row-parallel program and the numpy reference."""
    import dataclasses

    import gguf
    from tiny import TINY, tiny_vocab, tiny_weights

    import workbench as wb
    from workbench.models.gguf_writer import write_gguf

    config = dataclasses.replace(TINY, n_kv_heads=n_kv, head_dim=32, ffn=128, query_pre_attn_scalar=32)
    tensors = {}
    for name, w in tiny_weights(config).items():
        q8 = w.ndim == 2 and w.shape[1] % 32 == 0
        tensors[name] = (
            (GGMLType.Q8_0, gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0))
            if q8
            else (GGMLType.F32, w)
        )
    path = tmp_path / f"tiny-{n_kv}-kv-heads.gguf"
    write_gguf(path, config, tensors, tiny_vocab())
    model = wb.load(str(path))
    ids = list(range(10, 38))

    def decode(name: str, **options) -> tuple[np.ndarray, object]:
        backend = make_backend(name, model, **options)
        cache = backend.new_cache(64)
        backend.run(backend.prepare_graph(model.graph(4, 1)), Step.single(cache, ids[:4], 0))
        g1 = backend.prepare_graph(model.graph(1, 1))
        rows = [
            backend.run(g1, Step.single(cache, [t], 4 + i, "last", "decode"))[-1]
            for i, t in enumerate(ids[4:])
        ]
        prog = backend._programs[id(g1)][1] if name == "cpu" else None
        return np.array(rows), prog and prog.shards, prog and prog.code

    two, plan, code = decode("cpu", threads=2)
    assert plan is not None and plan.threaded
    modes = set(code["mode"][code["op"] == ins.ATTENTION])
    assert modes == ({ins.HEADS} if n_kv == 1 else {ins.KV_HEADS})
    one, plan1, _ = decode("cpu", threads=1)
    assert plan1 is not None and not plan1.threaded
    np.testing.assert_array_equal(one, two)
    rows, no_plan, _ = decode("cpu", threads=2, tune="decode_shards=1")
    assert no_plan is None
    want, _, _ = decode("numpy")
    np.testing.assert_allclose(two, rows, atol=1e-3, rtol=0)  # the order of float sums (measured 2.3e-4)
    np.testing.assert_allclose(two, want, atol=5e-3, rtol=0)
