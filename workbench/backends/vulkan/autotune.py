"""On-device search of per-shape kernel parameters (``workbench tune``), in the spirit of tinygrad's BEAM.

For every projection shape of a model's decode step (matvec) and prefill step (cooperative-matrix GEMM),
the tuner checks each candidate's output against numpy on sampled rows of a one-op program (the projection
on random inputs) *before* timing it, then times the survivors with device timestamps. The decode step's
shapes are timed where they run (the ``step`` objective): the device time of whole one-token decode steps
with the candidate in force, so that what the step pays for is what is measured (weights streamed from
memory rather than from the L2, the dispatch's share of the step's ramps and barriers); the others, and
every shape under ``objective="op"``, by the one-op program (the projection repeated ``REPEATS`` times).
The search starts from the defaults and, round by round, tries every one-parameter move of the best few
(the beam) until no move wins or the time budget is spent. Winners beating the default go to the tuning
database (:mod:`.tuned`), which the backend then applies to those shapes. Figures are device time
(measured), never estimates. See docs/backend-vulkan.md#the-autotuner.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...ops import reference as ref
from ...ops.graph import Graph, Op, TensorSpec
from ..base import UnsupportedOpError
from .program import Builder
from .recorded import Recorded
from .tuned import PARAMS, TuningDB, param_errors

KERNELS = ("matvec", "matmul_coop")  # the kernels with per-shape parameters
REPEATS = 16  # the projection's dispatches per timed program (its quantize pass runs once)
SAMPLE_ROWS = 256  # rows of the output checked against numpy
WARM_S = 0.1  # seconds of runs before a candidate's timed runs
OBJECTIVES = ("step", "op")
# step objective: matvec starting points besides the default, each with 32 rows a workgroup (whole int8 blocks
# of a gate/up output: QUANT_ROWS spares the next quant_act, which only whole steps show), which one-parameter
# moves from a few rows a workgroup would reach only through worse candidates
STEP_SEEDS = (
    {"wg": 1024, "row_threads": 32, "rows": 1},
    {"wg": 512, "row_threads": 16, "rows": 1},
    {"wg": 256, "row_threads": 8, "rows": 1},
    {"wg": 512, "row_threads": 32, "rows": 2},
)
CHOICES = {
    "wg": (32, 64, 128, 256, 512, 1024),
    "row_threads": (1, 2, 4, 8, 16, 32, 64, 128, 256),
    "rows": (1, 2, 4),
    "wm": (1, 2, 4),
    "tm": (1, 2, 3, 4),
    "tn": (1, 2, 3, 4),
    "bk": (32, 64),
    "ahead": (0, 1),
}


@dataclass
class ShapeResult:
    key: str
    default: dict[str, int]
    default_s: float
    best: dict[str, int]
    best_s: float
    tried: int
    rejected: int  # candidates that failed the numpy check or could not be built
    weight_bytes: int
    objective: str = "op"  # op: seconds of one projection; step: seconds of a whole decode step

    @property
    def speedup(self) -> float:
        return self.default_s / self.best_s if self.best_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        op = self.objective == "op"
        gbs = lambda s: round(self.weight_bytes / s / 1e9, 1) if s and op else None  # noqa: E731
        return {
            "key": self.key,
            "default": self.default,
            "default_us": round(self.default_s * 1e6, 2),
            "best": self.best,
            "best_us": round(self.best_s * 1e6, 2),
            "speedup": round(self.speedup, 3),
            "default_weight_gb_s": gbs(self.default_s),
            "best_weight_gb_s": gbs(self.best_s),
            "tried": self.tried,
            "rejected": self.rejected,
            "objective": self.objective,
            "timing": "measured (device timestamps)"
            + ("" if op else ": a whole one-token decode step's device time, not the projection's"),
        }


@dataclass
class StepClock:
    """Device seconds of a one-token decode step at a context of ``depth`` tokens, with some shapes'
    parameters forced: the median of ``steps`` steps after ``warm`` (the first builds the step's program),
    the sequence truncated back to ``depth`` after each measurement so that every candidate sees the same
    context."""

    engine: Any  # workbench.Engine on the vulkan backend
    depth: int
    warm: int = 3
    steps: int = 9

    def __post_init__(self) -> None:
        vocab = self.engine.model.config.vocab_size
        self.seq = self.engine.new_sequence(max_len=self.depth + self.warm + self.steps + 8)
        self.engine.forward(self.seq, [(977 * i + 13) % vocab for i in range(self.depth)])

    def seconds(self, params: dict[str, dict[str, int]]) -> float:
        b, vocab = self.engine.backend, self.engine.model.config.vocab_size
        b.try_params(params)
        times = []
        try:
            for i in range(self.warm + self.steps):
                self.engine.forward(self.seq, [(500 + 31 * i) % vocab])
                t = b.device_step_seconds()
                if t is None:
                    raise RuntimeError("this device gives no timestamps for a step: use objective 'op'")
                if i >= self.warm:
                    times.append(t)
        finally:
            self.seq.cache.truncate(self.depth)
            del self.seq.tokens[self.depth :]
        return float(statistics.median(times))


@dataclass
class Tuner:
    """Searches the shapes of one model on one backend's device."""

    backend: Any  # VulkanBackend (not imported: the backend module imports this one's siblings)
    beam: int = 3
    budget_s: float = 600.0
    log: Callable[[str], None] = print
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    # "step": one-token matvec shapes timed in whole decode steps (needs ``engine``); "op": every shape alone
    objective: str = "op"
    engine: Any = None  # the Engine of ``backend`` (the step objective's decode steps)
    depth: int = 512  # context of the step objective's decode steps (run() sets the prompt length)
    won: dict[str, dict[str, int]] = field(default_factory=dict)  # step winners so far, kept in force
    clock: StepClock | None = None

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"tune: objective {self.objective!r}: choose from {', '.join(OBJECTIVES)}")
        if self.objective == "step" and self.engine is None:
            raise ValueError("tune: the step objective needs the backend's engine")

    def shapes(self, prompt_tokens: int) -> dict[str, dict[str, Any]]:
        """Every projection shape of the decode step (1 token) and of a prefill of ``prompt_tokens``."""
        b = self.backend
        found: dict[str, dict[str, Any]] = {}
        for n in (1, prompt_tokens):
            graph = b.prepare_graph(b.model.graph(n_tokens=n, n_logits=1))
            builder = Builder(b, graph, [], greedy=False)
            for op in graph.ops:
                if op.kind != "attention":  # attention needs caches; it has no per-shape parameters here
                    builder.emit(op)
            for key, call in builder.shapes:
                if key.split("/", 1)[0] in KERNELS and key not in found:
                    found[key] = call
        return found

    # -- one candidate ---------------------------------------------------------------------------
    def program(self, key: str, call: dict[str, Any], params: dict[str, int] | None):
        """A program running the shape's projection REPEATS times with ``params`` (None: defaults), its
        arena offsets, and the input/output tensor names."""
        b, t, k = self.backend, call["tokens"], call["cols"]
        w = b.weight(call["wname"])
        tensors = {"x": TensorSpec((t, k)), "y": TensorSpec((t, w.rows))}
        if call.get("post"):
            tensors |= {"res": TensorSpec((t, w.rows)), "out": TensorSpec((t, w.rows))}
        graph = Graph(b.model.config, t, t, [], tensors, {}, outputs=())
        builder = Builder(b, graph, [], greedy=False)
        if params is not None:
            builder.forced[key] = params
        op = Op("tune", "matmul", ("x",), ("y",), (call["wname"],))
        for _ in range(REPEATS):
            if call["kind"] == "gemm":
                builder.gemm(op, "x", "y", call["wname"])
            else:
                post = call.get("post")
                if post:
                    post = (post[0], post[1], "res", "out")
                builder.projection(op, "x", "y", call["wname"], call.get("norm"), call.get("eps", 0.0),
                                   call.get("up"), post)  # fmt: skip
        out = "out" if call.get("post") else "y"
        dispatches, offsets, total = builder.finish({out, "x"} | ({"res"} if call.get("post") else set()))
        size = t * w.rows
        prog = Recorded(b.dev, b.pipes, dispatches, total, b.params, b.smalls, b.dummy, (offsets[out], size),
                        True, np.zeros(t, np.uint32))  # fmt: skip
        for name in builder.pinned:
            b.transfers.upload(prog.arena, np.zeros(builder.sizes[name], np.uint32), 4 * offsets[name])
        return prog, offsets, out

    def reference(self, call: dict[str, Any], x: np.ndarray, res: np.ndarray | None, rows: np.ndarray):
        """numpy's output of the projection on ``x`` for the sampled ``rows`` (all rows for the post-norm,
        whose norm spans the row)."""
        m = self.backend.model
        xin = x
        if call.get("norm"):
            xin = ref.rmsnorm(x, m.weights[call["norm"]].dequantize(), call["eps"])
        w = m.weights[call["wname"]]
        if call.get("post"):
            y = ref.matmul(xin, w.dequantize())
            pw, peps = call["post"][0], call["post"][1]
            return res + ref.rmsnorm(y, m.weights[pw].dequantize(), peps)
        y = ref.matmul(xin, _rows(w, rows))
        if call.get("up"):
            y = ref.gelu_mul(y, ref.matmul(xin, _rows(m.weights[call["up"]], rows)))
        return y

    def measure(
        self, key: str, call: dict[str, Any], params: dict[str, int] | None, check: tuple, timed: bool = True
    ) -> float:
        """Device seconds of one projection with ``params`` (0.0 untimed: the check alone); raises
        ValueError when its output is wrong."""
        x, res, rows, want, tol = check
        prog, offsets, _ = self.program(key, call, params)
        try:
            tr = self.backend.transfers
            tr.upload(prog.arena, x, 4 * offsets["x"])
            if res is not None:
                tr.upload(prog.arena, res, 4 * offsets["res"])
            t = call["tokens"]
            zeros = np.zeros(t, np.int64)
            prog.run(zeros, zeros, np.zeros(1, np.int64))
            got = prog.readback.view(np.float32).reshape(t, -1)
            got = got if call.get("post") else got[:, rows]
            err = float(np.abs(got - want).max())
            if not np.isfinite(err) or err > tol:
                raise ValueError(f"output differs from numpy by {err:.3g} (tolerance {tol:.3g})")
            if not timed:
                return 0.0
            # keep the device busy for WARM_S first: clocks rise only under sustained load, and a candidate
            # timed from idle reads several times slower than in a model's steps
            end = time.monotonic() + WARM_S
            while time.monotonic() < end:
                prog.run(zeros, zeros, np.zeros(1, np.int64))
            times = []
            for _ in range(7):
                prog.run(zeros, zeros, np.zeros(1, np.int64))
                times.append(prog.step_seconds())
            return float(np.median(times)) / REPEATS
        finally:
            prog.destroy()

    def check_data(self, key: str, call: dict[str, Any]) -> tuple:
        """Random inputs, the sampled rows and numpy's answer for them, and the tolerance."""
        b, t, k = self.backend, call["tokens"], call["cols"]
        w = b.weight(call["wname"])
        x = self.rng.standard_normal((t, k)).astype(np.float32)
        res = self.rng.standard_normal((t, w.rows)).astype(np.float32) if call.get("post") else None
        n = min(SAMPLE_ROWS, w.rows)
        rows = np.unique(np.concatenate([[0, w.rows - 1], self.rng.choice(w.rows, n, replace=False)]))
        want = self.reference(call, x, res, rows)
        low_precision = "/q8" in key or "/f16" in key or call["kind"] == "gemm"  # int8 or fp16 inputs
        rel = 3e-2 if low_precision else 1e-3
        return x, res, rows, want, rel * float(np.abs(want).max()) + 1e-5

    def in_step(self, key: str, call: dict[str, Any]) -> bool:
        """Whether ``key`` is timed in whole decode steps: the step objective and a one-token matvec."""
        return self.objective == "step" and key.startswith("matvec/") and call["tokens"] == 1

    def cost(self, key: str, call: dict[str, Any], params: dict[str, int] | None, check: tuple) -> float:
        """Seconds that rank ``params`` (None: the defaults) for ``key``: the projection's own, or (the step
        objective) the decode step's with them in force beside the winners found so far, checked first."""
        if not self.in_step(key, call):
            return self.measure(key, call, params, check)
        self.measure(key, call, params, check, timed=False)
        if self.clock is None:
            self.clock = StepClock(self.engine, self.depth)
        trial = {k: v for k, v in self.won.items() if k != key}
        return self.clock.seconds(trial | ({key: params} if params is not None else {}))

    # -- the search -------------------------------------------------------------------------------
    def tune_shape(self, key: str, call: dict[str, Any], deadline: float) -> ShapeResult:
        kernel = key.split("/", 1)[0]
        default = self.defaults(key, call)
        check = self.check_data(key, call)
        default_s = self.cost(key, call, None, check)
        seen = {_frozen(default): default_s}
        beam = [(default_s, default)]
        rejected = 0

        def fresh(cand: dict[str, int]) -> bool:
            return _frozen(cand) not in seen and not param_errors(kernel, cand, self.backend.dev.features)

        def timed(cand: dict[str, int]) -> float:
            """The candidate's cost; inf (counted and logged) when it fails its check or cannot be built."""
            nonlocal rejected
            fz = _frozen(cand)
            try:
                seen[fz] = self.cost(key, call, cand, check)
            except (ValueError, UnsupportedOpError, RuntimeError) as e:
                seen[fz] = float("inf")
                rejected += 1
                self.log(f"  rejected {cand}: {e}")
            return seen[fz]

        stored = [self.won[key]] if key in self.won else []
        for cand in [*STEP_SEEDS, *stored] if self.in_step(key, call) else []:
            if fresh(cand) and time.monotonic() < deadline and (s := timed(cand)) < float("inf"):
                beam = sorted([*beam, (s, cand)], key=lambda p: p[0])[: self.beam]
        while time.monotonic() < deadline:
            improved = False
            for _, params in list(beam):
                for cand in neighbours(kernel, params):
                    if not fresh(cand):
                        continue
                    if time.monotonic() >= deadline:
                        break
                    s = timed(cand)
                    if s < float("inf") and (s < beam[-1][0] or len(beam) < self.beam):
                        improved = True
                        beam = sorted([*beam, (s, cand)], key=lambda p: p[0])[: self.beam]
            if not improved:
                break
        best_s, best = beam[0]
        if best != default:
            # the default again, now that the device has run the shape for a while: the first timing of a
            # shape can read several times slower (a device coming out of idle), which made a winner of a
            # candidate slower than the warm default (experiments/h200/notes.md)
            default_s = min(default_s, self.cost(key, call, None, check))
            if best_s >= default_s:
                best_s, best = default_s, default
        w = self.backend.weight(call["wname"])
        nbytes = w.nbytes * (2 if call.get("up") else 1)
        objective = "step" if self.in_step(key, call) else "op"
        if objective == "step" and best != default and best_s < default_s:
            self.won[key] = best
        else:
            self.won.pop(key, None)
        return ShapeResult(key, default, default_s, best, best_s, len(seen), rejected, nbytes, objective)

    def defaults(self, key: str, call: dict[str, Any]) -> dict[str, int]:
        """The parameters the backend uses for this shape without a database entry."""
        v = self.backend.tuning.values
        if call["kind"] == "gemm":
            return {"wg": v["matmul_coop.wg"], "wm": v["matmul_coop.wm"], "tm": v["matmul_coop.tm"],
                    "tn": v["matmul_coop.tn"], "bk": v["matmul_coop.bk"], "ahead": v["matmul_coop.ahead"]}  # fmt: skip
        prog, _, _ = self.program(key, call, None)
        try:
            spec = dict(next(d.spec for d in prog.dispatches if d.kernel == "matvec"))
        finally:
            prog.destroy()
        return {"wg": spec[0], "row_threads": spec[1], "rows": spec[4]}

    def run(
        self, prompt_tokens: int = 512, db: TuningDB | None = None, kernels: tuple[str, ...] = KERNELS
    ) -> list[ShapeResult]:
        """Tune the shapes of ``kernels`` (``matvec``: decode; ``matmul_coop``: the prefill GEMM)."""
        db = db or TuningDB.load()
        start = time.monotonic()
        shapes = {k: c for k, c in self.shapes(prompt_tokens).items() if k.split("/", 1)[0] in kernels}
        self.log(
            f"tune: {len(shapes)} shapes on {self.backend.dev.features.name}, budget {self.budget_s:.0f} s"
        )
        self.depth = prompt_tokens
        if self.objective == "step":  # each shape is timed with the others at their stored winners
            stored = db.for_device(self.backend.dev.features).params
            self.won = {k: dict(v) for k, v in stored.items() if k in shapes and self.in_step(k, shapes[k])}
        results = []
        for i, (key, call) in enumerate(shapes.items()):
            left = self.budget_s - (time.monotonic() - start)
            if left <= 0:
                self.log(f"tune: budget spent; {len(shapes) - i} shapes left at their defaults")
                break
            deadline = time.monotonic() + left / (len(shapes) - i)  # an equal share of what is left
            r = self.tune_shape(key, call, deadline)
            results.append(r)
            self.log(
                f"[{i + 1}/{len(shapes)}] {key}: {r.default_s * 1e6:.1f} -> {r.best_s * 1e6:.1f} us "
                f"{'a decode step ' if r.objective == 'step' else ''}({r.speedup:.2f}x, {r.tried} tried) {r.best}"
            )
            self.store(db, r)
        if self.engine is not None:
            self.backend.try_params({})
        return results

    def store(self, db: TuningDB, r: ShapeResult) -> None:
        """Keep ``r``'s winner where it beats the default, else drop the shape's entry (an older winner, of
        another kernel version say, must not stay); saved at once, so an interrupted tune keeps what it found."""
        if r.best != r.default and r.best_s < r.default_s:
            db.put(self.backend.dev.features, r.key, r.best,
                   {"us": round(r.best_s * 1e6, 3), "default_us": round(r.default_s * 1e6, 3),
                    "objective": r.objective})  # fmt: skip
        else:
            db.remove(self.backend.dev.features, r.key)
        db.save()


def neighbours(kernel: str, params: dict[str, int]) -> Iterator[dict[str, int]]:
    """Every candidate one step away in one parameter (the next larger or smaller choice)."""
    for name in PARAMS[kernel]:
        opts = CHOICES[name]
        cur = params[name]
        i = opts.index(cur) if cur in opts else min(range(len(opts)), key=lambda j: abs(opts[j] - cur))
        for j in (i - 1, i + 1):
            if 0 <= j < len(opts) and opts[j] != cur:
                yield {**params, name: opts[j]}


def _frozen(p: dict[str, int]) -> tuple:
    return tuple(sorted(p.items()))


def _rows(w, rows: np.ndarray) -> np.ndarray:
    fn = getattr(w, "dequantize_rows", None)
    return fn(rows) if fn is not None else w.dequantize()[rows]
