"""The ``cpu`` backend: numba kernels on weights in their GGUF block formats, fused ops, host threads.

Decode (a few activation rows) multiplies quantized weights in place with fused dequantize-and-dot
kernels, activations quantized per 32-block (``act_quant``: ``int16`` default, ``int8`` as llama.cpp does,
by ``vpdpbusd`` on AVX512-VNNI hosts, ``none`` for the exact float path). Prefill (many rows) dequantizes
weights to float32 (kept while they fit in ``dense_cache_mib``, else tile by tile) and multiplies with BLAS.
The graph is rewritten with the fusions of :mod:`workbench.ops.fusion`; each fused kind has one handler (:mod:`.handlers`).
How kernels are chosen, the tunables and what was measured: docs/backend-cpu.md.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np
from llvmlite import binding as llvm
from threadpoolctl import ThreadpoolController

from ... import blas_env
from ...hostinfo import host_cores, host_cpu_name
from ...models.model import Model
from ...numba_jit import numba, stream_sum
from ...ops import reference as ref
from ...ops.fusion import RULES, fuse
from ...ops.graph import Graph, Op
from ...runtime.kv_cache import KVCache
from ..base import Backend, DeviceInfo, OpObserver, Step
from . import batched, dispatch, labels
from . import gemma3n as g3
from . import instructions as ins
from . import interleaved as il
from . import kernels as k
from . import layouts as ly
from . import matvec as mv
from . import program as pg
from . import projection as pj
from . import qformats as qf
from . import shards as sh
from . import sparse as sp
from . import step_inputs as si
from .attend_blas import attend  # noqa: F401 (re-exported: tests import it from the package)
from .compile_progress import CompileProgress
from .handlers import HANDLERS
from .weights import CpuWeight

ACT_QUANT = {"int16": 32767, "int8": 127, "none": 0}


class CpuBackend(Backend):
    """numba kernels on the host CPU."""

    name = "cpu"
    tunable_names = (
        "act_quant",
        "fused",
        "gemv_max_rows",
        "dense_cache_mib",
        "rows_per_task",
        "batch_rows",
        "batch_min_rows",
        "q5_0_as_q8_0",
        "q5_0_as_x4",
        "q6_k_as_i8",
        "interleave_rows",
        "decode_shards",
        "shard_copy_mib",
        "sparse_skip",
        "prefill_gemm",
    )

    def __init__(
        self,
        model: Model,
        threads: int | None = None,
        act_quant: str = "int16",
        fused: bool = True,
        gemv_max_rows: int = 8,
        dense_cache_mib: int = 1024,
        rows_per_task: int = mv.ROWS_PER_TASK,
        batch_rows: int = 16,
        batch_min_rows: int = 9,
        q5_0_as_q8_0: bool | None = None,
        q5_0_as_x4: bool | None = None,
        q6_k_as_i8: bool = True,
        interleave_rows: bool | None = None,
        decode_shards: int | None = None,
        shard_copy_mib: int = 1024,
        sparse_skip: bool = True,
        prefill_gemm: str = "auto",
        tune: str | None = None,
    ):
        super().__init__(model, threads, tune)
        if blas_env.SPINNING:
            warnings.warn(
                "numpy was imported before workbench, so OpenBLAS keeps its default thread spin (~0.1 s after "
                "each BLAS call): the cpu backend's first decode steps after a prefill run slower. Import "
                "workbench first, or set OPENBLAS_THREAD_TIMEOUT=4 in the environment.",
                stacklevel=2,
            )
        act_quant = self.tunable("act_quant", act_quant)
        fused = self.tunable("fused", fused)
        gemv_max_rows = self.tunable("gemv_max_rows", gemv_max_rows)
        dense_cache_mib = self.tunable("dense_cache_mib", dense_cache_mib)
        self.rows_per_task = self.tunable("rows_per_task", rows_per_task)
        if self.rows_per_task < 1:
            raise ValueError(f"rows_per_task must be >= 1, got {self.rows_per_task}")
        if act_quant not in ACT_QUANT:
            raise ValueError(f"act_quant must be one of {sorted(ACT_QUANT)}, got {act_quant!r}")
        if gemv_max_rows < 1 or dense_cache_mib < 0:
            raise ValueError("gemv_max_rows must be >= 1 and dense_cache_mib >= 0")
        self.act_quant, self.fused, self.gemv_max_rows = act_quant, fused, gemv_max_rows
        # Steps of up to gemv_max_rows rows (batched decode, speculative verification) run the one-row
        # kernels for each row over each weight row, as single-token steps compute them. Steps of
        # batch_min_rows..batch_rows rows use the batched kernels, which compute rows in groups of 8 (a row's
        # result independent of the batch): dot_int16_rows8.py with act_quant int16/int8 (activations quantized as
        # single-token decode quantizes them), dot_f32_rows8.py with act_quant none (exact float activations). The
        # batched kernels start above 8 rows: below, the one-row kernels were faster (figures:
        # docs/backend-cpu.md#batched-kernels).
        self.batch_rows = self.tunable("batch_rows", batch_rows)
        self.batch_min_rows = self.tunable("batch_min_rows", batch_min_rows)
        # the layouts weights are repacked into at load (layouts.py: each one's default and why): tunable -> on
        host = ly.Host(wide=mv.WIDE, vnni=mv.VNNI, act_quant=act_quant)
        given = {"q5_0_as_q8_0": q5_0_as_q8_0, "q5_0_as_x4": q5_0_as_x4, "q6_k_as_i8": q6_k_as_i8,
                 "interleave_rows": interleave_rows}  # fmt: skip
        self.layouts = {
            name: self.tunable(name, default if given.get(name) is None else given[name])
            for name, default in ly.layout_defaults(host).items()
        }
        # Single-token decode steps split across threads by heads and hidden units (shards.py): two exchanges
        # between the threads a layer instead of ~5. Results depend on the number of shards, not of threads
        # (fewer threads run the shards in turn); 1: the row-parallel program of program.py. Default: 2 up to
        # 2 threads (1 and 2 threads then give the same results); with more threads the row-parallel program,
        # which puts every thread on every projection (shards leave all but decode_shards threads idle in the
        # layers; not measured on such hosts). Figures: docs/backend-cpu.md#decode-shards
        if decode_shards is None:
            decode_shards = 2 if (self.threads or numba.config.NUMBA_NUM_THREADS) <= 2 else 1
        self.decode_shards = self.tunable("decode_shards", decode_shards)
        if self.decode_shards < 1:
            raise ValueError(f"decode_shards must be >= 1, got {self.decode_shards}")
        # the shards' copies of their columns of the attention output and down weights (shards.py) may take
        # at most this much memory (a third of a layer's weight bytes: several GB for Gemma 3 12B and 27B); past
        # it the program runs row-parallel (figures: docs/backend-cpu.md#decode-shards)
        self.shard_copy_mib = self.tunable("shard_copy_mib", shard_copy_mib)
        if self.shard_copy_mib < 0:
            raise ValueError(f"shard_copy_mib must be >= 0, got {self.shard_copy_mib}")
        self.shard_refusal = ""  # why the last shard plan was refused, where the planner says
        # Gemma 3n's sparse layers (gemma3n.py): steps of up to gemv_max_rows rows compute only the up rows
        # and down columns of the FFN units the Gaussian top-k kept (the fusion rmsnorm_topk_ffn, with
        # fused on); 0: the dense twin, every unit computed (figures: docs/backend-cpu.md#gemma-3n)
        self.sparse_skip = self.tunable("sparse_skip", sparse_skip)
        self.topk_units = np.zeros(2, np.int64)  # units the skipping path computed, units it ranked
        self.topk_down: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # ffn_down transposed (gemma3n.py)
        # prefill's Q4_K and Q6_K_I8 projections: int8 GEMM or float BLAS ("auto": resolved once the weights
        # are loaded; projection.auto_prefill_gemm says how and why)
        self.prefill_gemm = pj.checked_prefill_gemm(self.tunable("prefill_gemm", prefill_gemm))
        if self.batch_min_rows < 1 or self.batch_rows < 0:
            raise ValueError("batch_min_rows must be >= 1 and batch_rows >= 0 (0: no batched kernel)")
        self.small_rows = max(gemv_max_rows, self.batch_rows)  # steps up to this many rows avoid BLAS
        self.dense_budget = dense_cache_mib << 20
        self.dense: dict[
            str, np.ndarray
        ] = {}  # float32 copies of weights for prefill's GEMMs (projection.py)
        self._graphs: dict[int, Graph] = {}
        self._programs: dict[int, tuple[Graph, ins.Program | None]] = {}
        # (weight, shards, shard) -> (weight-table row, array): a shard's columns copied (shards.py)
        self.col_shares: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray] | None] = {}
        self.levels = ACT_QUANT[act_quant]
        self.vnni = act_quant == "int8" and mv.VNNI  # int8 activations by vpdpbusd (dot_int8_vnni.py)
        self._rope: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._n_threads = self.threads or numba.config.NUMBA_NUM_THREADS
        self._blas = ThreadpoolController()
        self._blas_threads = 0
        kernels = [
            i.get("architecture") or "" for i in self._blas.info() if i.get("internal_api") == "openblas"
        ]
        pin = blas_env.narrow_pin(llvm.get_host_cpu_features().flatten(), kernels)
        if pin:
            warnings.warn(pin, stacklevel=2)
        self.weights: dict[str, CpuWeight] = {}
        self.norms: dict[str, np.ndarray] = {}
        self.small: dict[str, np.ndarray] = {}  # Gemma 3n's routers, coefficients and scales, float32
        with CompileProgress():  # repacking and the warm-up compile every kernel the model needs
            self._prepare()
            if self.prefill_gemm == "auto":
                self.prefill_gemm = pj.auto_prefill_gemm(self)
            widest = max((w.cols for w in self.weights.values() if w.fmt in mv.QUANT_FMTS), default=32)
            self.xq = mv.act_codes(1, widest, self.vnni)  # activation scratch of the step programs
            self.xd = np.zeros((1, widest // 32), np.float32)
            self.xs = np.zeros_like(self.xd)
            self.jit = self._warm_up()

    # -- setup -------------------------------------------------------------------------------------------
    def _prepare(self) -> None:
        graph = self.model.graph(1)
        by_rows = {name for op in graph.ops if op.kind in sp.HANDLERS for name in op.weights}
        topk = [op for op in self.prepare_graph(graph).ops if op.kind == g3.TOPK_FFN]
        by_rows |= {op.attrs["parts"][3].weights[0] for op in topk}  # up rows read one by one
        embed_only = {n for op in graph.ops if op.kind == "embed" for n in op.weights}
        embed_only -= {n for op in graph.ops if op.kind != "embed" for n in op.weights}
        for op in graph.ops:
            for name in op.weights:
                qt = self.model.weights[name]
                if op.kind == "rmsnorm":
                    self.norms[name] = qt.dequantize().astype(np.float32).reshape(-1)
                elif op.kind in g3.SMALL_WEIGHT_KINDS:
                    self.small[name] = np.ascontiguousarray(qt.dequantize(), np.float32)
                elif op.kind in g3.STACKED_KINDS:  # (n-1, hidden, hidden): a weight per slice
                    for i, sub in enumerate(g3.slice_names(name, qt.shape[0])):
                        self.weights[sub] = self._native(sub, qt=g3.slice_tensor(qt, i))
                elif name in embed_only and qt.type not in mv.QUANT_TYPES:
                    self.weights[name] = g3.RowTable(name, qt)  # type: ignore[assignment]
                elif name not in self.weights:
                    # a table only gathered from (Gemma 3n's per-layer embeddings) keeps its stored blocks
                    self.weights[name] = self._native(name, interleave=name not in by_rows,
                                                      stored=name in embed_only)  # fmt: skip
        for op in topk:
            g3.down_store(self, op.attrs["parts"][5].weights[0])

    def _native(self, name: str, interleave: bool = True, qt=None, stored: bool = False) -> CpuWeight:
        """The weight ``name`` (or the tensor ``qt`` under that name) in the layout the kernels read
        (``interleave``: may it interleave rows; ``stored``: keep the stored blocks, no repacking)."""
        qt = self.model.weights[name] if qt is None else qt
        return ly.native_weight(name, qt, self.layouts, interleave, stored)

    def _warm_up(self) -> dict[str, Any]:
        """Compile (or load from numba's cache) every kernel the model needs, outside the token loop."""
        t0 = time.perf_counter()
        misses0 = _cache_misses()
        for n in sorted({self.small_rows + 1, self.batch_min_rows, 1}, reverse=True):
            cache = self.new_cache(n)
            step = Step.single(cache, np.zeros(n, np.int32), 0, "last", "warmup")
            self.run(self.prepare_graph(self.model.graph(n, 1)), step)
        compiled = _cache_misses() - misses0
        return {"warm_up_s": time.perf_counter() - t0, "kernels_compiled": compiled,
                "from_cache": compiled == 0}  # fmt: skip

    @property
    def device(self) -> DeviceInfo:
        return DeviceInfo(
            "cpu",
            host_cpu_name(),
            "cpu",
            {
                "threads": self._n_threads,
                "act_quant": self.act_quant,
                "fused": self.fused,
                "rows_per_task": self.rows_per_task,
                "batch_rows": [self.batch_min_rows, self.batch_rows],
                "q5_0_as_q8_0": self.layouts["q5_0_as_q8_0"],
                "q5_0_as_x4": self.layouts["q5_0_as_x4"],
                "q6_k_as_i8": self.layouts["q6_k_as_i8"],
                "interleave_rows": self.layouts["interleave_rows"],
                "decode_shards": self._shards_label(),
                "decode_program": self._program_label(),
                "sparse_skip": self.sparse_skip,
                "prefill_gemm": labels.prefill_gemm(self.prefill_gemm, pj.int8_layouts(self)),
                "decode_kernels": labels.decode_kernels(self.vnni, self.layouts["interleave_rows"]),
                "llvm_cpu": llvm.get_host_cpu_name(),  # the core LLVM compiles for (e.g. znver1, znver5)
                "numba": numba.__version__,
                "threading_layer": labels.threading_layer(),
                "openblas_thread_timeout": blas_env.thread_timeout(),
                "gomp_spincount": blas_env.gomp_spin(),  # numba's OpenMP workers (omp threading layer)
                "blas": labels.blas_label(
                    self._blas
                ),  # prefill's GEMMs: e.g. OpenBLAS's kernels (Haswell: AVX2)
                "profile": "host",
                **getattr(self, "jit", {}),
            },
        )

    @classmethod
    def probe(cls) -> dict:
        return {
            "available": True,
            "reason": "",
            "devices": [
                {"name": host_cpu_name(), "kind": "cpu", "cores": host_cores(), "numba": numba.__version__}
            ],
        }

    def threads_used(self) -> int:
        return self._n_threads

    def new_cache(self, max_len: int, slack: int = 0) -> KVCache:
        return KVCache(self.model.config, max_len, slack)

    def prepare_graph(self, graph: Graph) -> Graph:
        if not self.fused:
            return graph
        g = self._graphs.get(id(graph))
        if g is None:
            topk = any(op.kind == "gaussian_topk" for op in graph.ops) and self.sparse_skip
            g = self._graphs[id(graph)] = fuse(graph, (g3.TOPK_FFN, *RULES)) if topk else fuse(graph)
        return g

    def supports(self, op: Op) -> bool:
        return op.kind in HANDLERS

    def close(self) -> None:
        self.dense.clear()

    # -- execution -------------------------------------------------------------------------------------
    def run(self, graph: Graph, step: Step, observer: OpObserver | None = None) -> np.ndarray:
        self.check_tokens(step)
        numba.set_num_threads(self._n_threads)
        # BLAS threads only for steps big enough to use them: on small steps an idle BLAS pool spinning
        # beside numba's workers costs more than the small products gain (measured 4x slower attention)
        self._set_blas_threads(self._n_threads if step.n_tokens > self.small_rows else 1)
        self._rope.clear()
        prog = self._program(graph, step)
        if prog is not None:
            return self._execute(prog, step, observer)[0].copy()
        return self.run_ops(graph, step, lambda op: HANDLERS.get(op.kind), observer)

    def run_greedy(self, graph: Graph, step: Step, observer: OpObserver | None = None) -> int:
        prog = self._program(graph, step)
        if prog is None:
            return super().run_greedy(graph, step, observer)
        self.check_tokens(step)
        numba.set_num_threads(self._n_threads)
        self._set_blas_threads(1)
        logits, token = self._execute(prog, step, observer, argmax=True)
        return token if token >= 0 else int(np.argmax(logits[-1]))

    def _program(self, graph: Graph, step: Step) -> ins.Program | None:
        """The compiled program of a one-token step's graph (None: the graph runs op by op)."""
        if not (self.fused and si.runnable(step)):
            return None
        if id(graph) not in self._programs:  # the graph is kept with its program: its id stays its own
            prog = ins.lower(self, graph)
            if prog is not None and self.decode_shards > 1:
                prog.shards = sh.plan(self, prog, self.decode_shards, self._shards_threaded())
            self._programs[id(graph)] = (graph, prog)
        return self._programs[id(graph)][1]

    def _execute(self, prog: ins.Program, step: Step, observer: OpObserver | None, argmax: bool = False):
        return (sh.execute if prog.shards is not None else pg.execute)(self, prog, step, observer, argmax)

    def _program_label(self) -> str:
        """Whether one-token steps run as the compiled program, or op by op and why (kinds or weight
        formats the program has no lowering for, e.g. Gemma 3n's)."""
        if not self.fused:
            return "off (fused=0): op by op"
        kinds = sorted({op.kind for op in self.prepare_graph(self.model.graph(1)).ops} - ins.LOWERED)
        if kinds:
            return "op by op: the one-token program does not cover " + ", ".join(kinds)
        if any(w.fmt not in mv.QUANT_FMTS for w in self.weights.values()):
            return "op by op: float weights (the one-token program reads quantized blocks only)"
        return "compiled program"

    def _shards_label(self) -> str:
        """How single-token decode steps run: in shards (how many, on which threads) or as one program."""
        if self.decode_shards == 1:
            return "off"
        if not any(p is not None and p.shards is not None for _, p in self._programs.values()):
            why = self.shard_refusal or "no shard plan for the decode graph: shards.py says which"
            return f"{self.decode_shards}, unused ({why})"
        how = "a thread each" if self._shards_threaded() else "in turn on one thread"
        copies = sum(v[1].nbytes for v in self.col_shares.values() if v is not None) / 1e6
        return f"{self.decode_shards}, {how}, {copies:.1f} MB of column copies"

    def _shards_threaded(self) -> bool:
        """Whether decode shards run one thread each: as many threads, and a threading layer that hands each
        of a parallel loop's first iterations to its own thread (OpenMP's static schedule, the workqueue;
        TBB may run two on one thread, where a shard would wait for the other at a barrier forever)."""
        stream_sum(np.zeros(16, np.float32))  # starts the threading layer
        return self._n_threads >= self.decode_shards and numba.threading_layer() in ("omp", "workqueue")

    def _set_blas_threads(self, n: int) -> None:
        if n != self._blas_threads:
            self._blas.limit(limits=n, user_api="blas")
            self._blas_threads = n

    def project(self, x: np.ndarray, names: tuple[str, ...]) -> list[np.ndarray]:
        """``x @ W.T`` for each weight: fused matvec for few rows, dequantized BLAS GEMM for many."""
        return pj.project(self, x, [self.weights[n] for n in names])

    def project_weights(self, x: np.ndarray, ws: list) -> list[np.ndarray]:
        """:meth:`project` for weight objects (also row subsets that have no name in ``self.weights``)."""
        return pj.project(self, x, ws)

    def rope_tables(self, op: Op, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = op.attrs
        key = (a["head_dim"], a["base"], a.get("scale", 1.0))
        tab = self._rope.get(key)
        if tab is None:
            tab = self._rope[key] = ref.rope_tables(positions, *key)
        return tab


def _cache_misses() -> int:
    return sum(sum(d.stats.cache_misses.values()) for d in _DISPATCHERS)


_DISPATCHERS = [
    getattr(m, n)
    for m in (k, mv, qf, sp, batched, dispatch, il, pg, sh, g3)
    for n in dir(m)
    if isinstance(getattr(m, n), numba.core.dispatcher.Dispatcher)
]
