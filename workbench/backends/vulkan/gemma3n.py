"""Dispatches of Gemma 3n's op kinds (docs/gemma3n.md) on the Vulkan backend: shaders/gemma3n.comp, one define
per kind, plus the backend's matvec/GEMM for the AltUp projections. ``Builder.emit`` calls the function
named after each kind; :func:`fold` lets one dispatch do a neighbouring op's work (``gemma3n.fuse``).

Each new kind is one dispatch per step (the AltUp projections, applied once per step, add their matvecs).
The sparse layers' skipping (``ffn.sparse_skip``: the up projection computes only the rows the Gaussian
top-k kept; the down projection reads only the kept units' rows of a transposed copy, :func:`sparse_down`,
or with ``ffn.down_t=0`` skips zero chunks of its input) lives in ``Builder`` (``sparse_up_of``), here and in
matvec.comp (``SPARSE_UP``, ``SKIP_ZERO``). Kernels, tunables and what to measure:
docs/backend-vulkan.md#gemma-3n.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...ops.graph import Op
from ..base import UnsupportedOpError

if TYPE_CHECKING:
    from .program import Builder

KINDS = (
    "rmsnorm_plain",
    "shared_kv_attention",
    "altup_expand",
    "altup_unembed",
    "altup_predict",
    "altup_correct",
    "laurel_residual",
    "gaussian_topk",
    "ple_project",
    "ple_gate",
    "ple_inject",
)
# the kernel names of one dispatch each, by define (all_variants() lists them)
OPS = (
    "ALTUP_EXPAND",
    "ALTUP_UNEMBED",
    "ALTUP_SPLIT",
    "ALTUP_PREDICT",
    "ALTUP_CORRECT",
    "LAUREL",
    "LAUREL_NORM",
    "TOPK",
    "PLE_PROJECT",
    "PLE_INJECT",
    "PLE_INJECT_NORM",
    "MATMUL_SMALL",
    "DOWN_T",
    "DOWN_T_REDUCE",
)
PUSH = ("a", "b", "c", "d", "y", "z")  # tensors of the push block: <name>_off, <name>_stride


def dispatch(b: Builder, op: Op, name: str, groups: tuple[int, int, int], reads: list[str], writes: list[str],
             weight: Any = None, defines: tuple[str, ...] = (), wg: int = 0, **push: Any) -> None:  # fmt: skip
    """One gemma3n.comp dispatch (``weight``: the buffer of binding 0; ``wg``: a workgroup size other than
    ``gemma3n.wg``); unset push fields are zero."""
    full: dict[str, Any] = {f"{t}_{s}": 0 for t in PUSH for s in ("off", "stride")}
    full.update(width=0, n=0, w_off=0, w2_off=0, w3_off=0, w4_off=0, eps=0.0, scale=0.0)
    full.update(push)
    spec = [(0, wg)] if wg else None
    b.add(op, "gemma3n", full, groups, reads, writes, [f"OP_{name}", *defines], spec, weight=weight)


def _wg(b: Builder) -> int:
    return b.backend.tuning["gemma3n.wg"]


def _users(b: Builder, t: str) -> list[Op]:
    return [o for o in b.graph.ops if t in o.inputs]


def _producer(b: Builder, t: str) -> Op | None:
    return next((o for o in b.graph.ops if t in o.outputs), None)


def _folded_norm(b: Builder, t: str) -> Op | None:
    """The plain RMSNorm op that produces ``t`` for a single Gemma 3n consumer, which then applies it
    (``gemma3n.fuse``): the post-attention and LAuReL post-norms (laurel_residual), the PLE post-norm
    (ple_inject)."""
    if not b.backend.tuning["gemma3n.fuse"]:
        return None
    p = _producer(b, t)
    if p is None or p.kind != "rmsnorm" or p.attr("group") or len(_users(b, t)) != 1:
        return None
    return p


def _laurel_norms(b: Builder, op: Op) -> tuple[Op, Op] | None:
    """The two norms laurel_residual ``op`` folds in (both, or neither)."""
    att, lau = _folded_norm(b, op.inputs[1]), _folded_norm(b, op.inputs[3])
    return (att, lau) if att is not None and lau is not None else None


def _injected(b: Builder, op: Op) -> Op | None:
    """The post-norm of ple_inject ``op`` when the next layer's altup_predict, its only reader, does the
    injection itself (``INJECT``: streams 1..3 + the normed PLE as it reads them): one dispatch less."""
    norm = _folded_norm(b, op.inputs[1])
    users = _users(b, op.outputs[0])
    if norm is None or len(users) != 1 or users[0].kind != "altup_predict":
        return None
    return norm if users[0].attrs["eps"] == norm.attrs["eps"] else None


def fold(b: Builder, op: Op) -> bool:
    """Whether ``op`` is done elsewhere (True: emit nothing for it): a norm its Gemma 3n consumer applies, a
    ple_inject the next altup_predict does, a ple_gate done by the matvec of its ``inp_gate`` (GATE_MUL,
    decode steps), which this emits."""
    if op.name in b.folded:
        return True
    if not b.graph.config.altup_inputs:  # not Gemma 3n
        return False
    if op.kind == "ple_inject" and _injected(b, op) is not None:
        return True
    if op.kind == "rmsnorm" and _folded_norm(b, op.outputs[0]) is op:
        user = _users(b, op.outputs[0])[0]
        return (
            user.kind == "laurel_residual" and _laurel_norms(b, user) is not None
        ) or user.kind == "ple_inject"
    if op.kind == "matmul" and b.backend.tuning["gemma3n.fuse"] and not b.backend.small_matrix(op.weights[0]):
        users = _users(b, op.outputs[0])
        x = op.inputs[0]
        if (
            len(users) == 1
            and users[0].kind == "ple_gate"
            and b.rows(x) <= b.backend.tuning["matvec.max_tokens"]
        ):
            gate = users[0]
            b.projection(
                op,
                x,
                gate.outputs[0],
                op.weights[0],
                ple=(gate.inputs[1], gate.layer * b.widths[op.outputs[0]]),
            )
            b.folded.add(gate.name)
            return True
    return False


def rmsnorm_plain(b: Builder, op: Op) -> None:
    """Gemma 3n's V norm: left to the RoPE dispatch that stores K and V (rmsnorm.comp V_NORM, see
    Builder.v_norms), else rmsnorm.comp NO_WEIGHT."""
    a = op.attrs
    users = _users(b, op.outputs[0])
    if (
        b.backend.tuning["gemma3n.fuse"]
        and len(users) == 1
        and users[0].kind == "attention"
        and users[0].inputs[2] == op.outputs[0]
    ):  # the V norm: done by the RoPE dispatch that stores K and V (rmsnorm.comp V_NORM), else before the store
        b.v_norms[op.outputs[0]] = op
        return
    b.rmsnorm(op, op.inputs[0], op.outputs[0], None, a["eps"], op.attr("group"), weightless=True)


def shared_kv_attention(b: Builder, op: Op) -> None:
    """Attention over layer ``kv_layer``'s cache, which an earlier op of the step extended: no store."""
    b.attention(op)


def altup_expand(b: Builder, op: Op) -> None:
    """The streams of the embedding: one matvec/GEMM of the (3H, H) stacked weight, then the rescale."""
    e, y = op.inputs[0], op.outputs[0]
    t, h = b.rows(e), b.widths[e]
    proj = b.tmp(f"{op.name}:proj", t, 3 * h)
    b.matmul(op, e, proj, op.weights[0])
    dispatch(b, op, "ALTUP_EXPAND", (4, t, 1), [e, proj], [y], a_off=b.ref(e), a_stride=h, b_off=b.ref(proj),
             b_stride=3 * h, c_off=b.ref(proj, h), c_stride=3 * h, d_off=b.ref(proj, 2 * h), d_stride=3 * h,
             y_off=b.ref(y), y_stride=b.widths[y], width=h)  # fmt: skip


def altup_unembed(b: Builder, op: Op) -> None:
    """The streams' mean: split streams 1..3, one matvec per stacked matrix, rescale and mean."""
    wg = _wg(b)
    x, y = op.inputs[0], op.outputs[0]
    r, h = b.rows(x), b.widths[y]
    ins = [b.tmp(f"{op.name}:in{i}", r, h) for i in (1, 2, 3)]
    outs = [b.tmp(f"{op.name}:proj{i}", r, h) for i in (1, 2, 3)]
    views = {f"{n}_off": b.ref(t) for n, t in zip("bcd", ins)} | {f"{n}_stride": h for n in "bcd"}
    dispatch(b, op, "ALTUP_SPLIT", (-(-h // wg), r, 3), [x], ins, a_off=b.ref(x), a_stride=b.widths[x],
             width=h, **views)  # fmt: skip
    for i in range(3):
        b.matmul(op, ins[i], outs[i], b.backend.weight_slice(op.weights[0], i))
    views = {f"{n}_off": b.ref(t) for n, t in zip("bcd", outs)} | {f"{n}_stride": h for n in "bcd"}
    dispatch(b, op, "ALTUP_UNEMBED", (1, r, 1), [x, *outs], [y], a_off=b.ref(x), a_stride=b.widths[x],
             y_off=b.ref(y), y_stride=h, width=h, **views)  # fmt: skip


def altup(b: Builder, op: Op) -> None:
    """AltUp predict or correct: one dispatch, every workgroup computing the router (``altup.split`` per token)."""
    a = op.attrs
    small, wg = b.backend.small_offset, _wg(b)
    k = op.kind
    h = b.widths[op.outputs[1]]
    t = b.rows(op.outputs[1])
    split = max(1, min(b.backend.tuning["altup.split"], -(-h // wg)))
    w = op.weights
    common = dict(width=h, eps=a["eps"], w_off=small(w[0]), w2_off=small(w[1]), w3_off=small(w[2]))
    s, out = op.outputs
    if k == "altup_predict":
        x = op.inputs[0]
        inject = _producer(b, x)
        norm = _injected(b, inject) if inject is not None and inject.kind == "ple_inject" else None
        if norm is not None:  # the previous layer's ple_inject, done here as the streams are read
            x, r = inject.inputs[0], norm.inputs[0]
            dispatch(b, op, "ALTUP_PREDICT", (split, t, 1), [x, r], [s, out], defines=("INJECT",), a_off=b.ref(x),
                     a_stride=b.widths[x], b_off=b.ref(r), b_stride=b.widths[r], y_off=b.ref(s),
                     y_stride=b.widths[s], z_off=b.ref(out), z_stride=h, w4_off=small(norm.weights[0]), **common)  # fmt: skip
            return
        dispatch(b, op, "ALTUP_PREDICT", (split, t, 1), [x], [s, out], a_off=b.ref(x), a_stride=b.widths[x],
                 y_off=b.ref(s), y_stride=b.widths[s], z_off=b.ref(out), z_stride=h, **common)  # fmt: skip
    else:
        p, z = op.inputs
        dispatch(b, op, "ALTUP_CORRECT", (split, t, 1), [p, z], [s, out], a_off=b.ref(p), a_stride=b.widths[p],
                 b_off=b.ref(z), b_stride=b.widths[z], y_off=b.ref(s), y_stride=b.widths[s], z_off=b.ref(out),
                 z_stride=h, w4_off=small(w[3]), **common)  # fmt: skip


def laurel_residual(b: Builder, op: Op) -> None:
    """The LAuReL residual, with both post-norms folded in where ``fold`` left them (``gemma3n.fuse``)."""
    small, wg = b.backend.small_offset, _wg(b)
    y = op.outputs[0]
    h, t = b.widths[y], b.rows(y)
    norms = _laurel_norms(b, op)
    ins = list(op.inputs)
    if norms:  # read the norms' inputs, normalize here
        ins[1], ins[3] = norms[0].inputs[0], norms[1].inputs[0]
    views = {f"{n}_off": b.ref(x) for n, x in zip("abcd", ins)}
    views |= {f"{n}_stride": b.widths[x] for n, x in zip("abcd", ins)}
    if norms:
        dispatch(b, op, "LAUREL_NORM", (1, t, 1), ins, [y], y_off=b.ref(y), y_stride=h, width=h,
                 w_off=small(norms[0].weights[0]), w2_off=small(norms[1].weights[0]), eps=norms[0].attrs["eps"],
                 **views)  # fmt: skip
    else:
        dispatch(b, op, "LAUREL", (-(-h // wg), t, 1), ins, [y], y_off=b.ref(y), y_stride=h, width=h,
                 **views)  # fmt: skip


def gaussian_topk(b: Builder, op: Op) -> None:
    """The Gaussian top-k of a sparse layer's gate: one workgroup per token."""
    a = op.attrs
    g, y = op.inputs[0], op.outputs[0]
    dispatch(b, op, "TOPK", (1, b.rows(g), 1), [g], [y], a_off=b.ref(g), a_stride=b.widths[g], y_off=b.ref(y),
             y_stride=b.widths[y], width=b.widths[g], scale=a["std_multiplier"])  # fmt: skip


def ple_project(b: Builder, op: Op) -> None:
    """Every layer's per-layer input: one workgroup per (layer, token)."""
    a = op.attrs
    small = b.backend.small_offset
    proj, rows = op.inputs
    y = op.outputs[0]
    p = a["group"]
    dispatch(b, op, "PLE_PROJECT", (b.widths[y] // p, b.rows(y), 1), [proj, rows], [y], a_off=b.ref(proj),
             a_stride=b.widths[proj], b_off=b.ref(rows), b_stride=b.widths[rows], y_off=b.ref(y),
             y_stride=b.widths[y], width=p, w_off=small(op.weights[0]), eps=a["eps"], scale=a["scale"])  # fmt: skip


def ple_gate(b: Builder, op: Op) -> None:
    """gelu(g) * the layer's slice of the per-layer inputs (eltwise.comp; in decode steps GATE_MUL of the
    inp_gate matvec does it instead, see ``fold``)."""
    g, pli = op.inputs
    y = op.outputs[0]
    p = b.widths[g]
    push = dict(a_off=b.ref(g), a_stride=p, b_off=b.ref(pli, op.layer * p), b_stride=b.widths[pli], y_off=b.ref(y),
                y_stride=b.widths[y], width=p, rows=b.rows(y), cap=0.0)  # fmt: skip
    groups = (-(-p // b.backend.tuning["eltwise.wg"]), b.rows(y), 1)
    b.add(op, "eltwise", push, groups, [g, pli], [y], ["OP_GELU_MUL"])


def ple_inject(b: Builder, op: Op) -> None:
    """The PLE added to streams 1..3, with the post-norm folded in where ``fold`` left it."""
    small, wg = b.backend.small_offset, _wg(b)
    x, r = op.inputs
    y = op.outputs[0]
    h = b.widths[r]
    norm = _folded_norm(b, r)
    if norm is not None:
        r = norm.inputs[0]
        dispatch(b, op, "PLE_INJECT_NORM", (1, b.rows(y), 1), [x, r], [y], a_off=b.ref(x), a_stride=b.widths[x],
                 b_off=b.ref(r), b_stride=b.widths[r], y_off=b.ref(y), y_stride=b.widths[y], width=h,
                 w_off=small(norm.weights[0]), eps=norm.attrs["eps"])  # fmt: skip
        return
    dispatch(b, op, "PLE_INJECT", (-(-4 * h // wg), b.rows(y), 1), [x, r], [y], a_off=b.ref(x),
             a_stride=b.widths[x], b_off=b.ref(r), b_stride=h, y_off=b.ref(y), y_stride=b.widths[y], width=h)  # fmt: skip


def sparse_down(b: Builder, op: Op, mm: Op, norm: Op, residual: str) -> None:
    """A sparse layer's down projection + post-norm + residual add (``matmul_rmsnorm_add``) in a decode step,
    from a float16 (``ffn.down_t=1``) or float32 (``=2``) transposed copy of the down weight (units as rows): only the rows of the
    units the Gaussian top-k kept are read, ~5 % of them, where the row-major weight's zero chunks
    (``SKIP_ZERO``) rarely free a whole memory sector. ``ffn.down_split`` workgroup rows share the units;
    a second dispatch sums their partials, normalizes and adds."""
    x, out = mm.inputs[0], op.outputs[0]
    t, f = b.rows(x), b.widths[x]
    w = b.backend.weight(b.backend.weight_transposed(mm.weights[0]))
    h = w.cols
    if len(w.parts) != 1 or h % 2 or w.rows != f:
        raise UnsupportedOpError(f"op {op.name}: the transposed down weight must be one buffer of even width")
    per = -(-f // max(1, min(b.backend.tuning["ffn.down_split"], f)))
    splits = -(-f // per)
    parts = b.tmp(f"{op.name}:down_partials", 1, splits * t * h)
    f32 = ("DOWN_T_F32",) if w.fmt == "F32" else ()
    dispatch(b, op, "DOWN_T", (-(-(h // 2) // _wg(b)), splits, 1), [x], [parts], weight=w.parts[0].buffer, defines=f32,
             a_off=b.ref(x), a_stride=f, y_off=b.ref(parts), width=h, n=f, w_off=per, c_stride=t)  # fmt: skip
    # one workgroup per token sums splits x H partials: as wide a workgroup as the device allows, up to 512
    feats = b.backend.dev.features
    cap = min(512, feats.max_invocations)
    if getattr(b.backend.dev, "required_subgroup_size", 0) and feats.max_workgroup_subgroups:
        cap = min(cap, feats.max_workgroup_subgroups * feats.subgroup_size)  # a required size caps subgroups
    wide = max(_wg(b), cap // feats.subgroup_size * feats.subgroup_size)
    dispatch(b, op, "DOWN_T_REDUCE", (1, t, 1), [parts, residual], [out], wg=wide, a_off=b.ref(parts), b_off=b.ref(residual),
             b_stride=b.widths[residual], y_off=b.ref(out), y_stride=b.widths[out], width=h, n=splits, c_stride=t,
             w_off=b.backend.small_offset(norm.weights[0]), eps=norm.attrs["eps"])  # fmt: skip


def small_matmul(b: Builder, op: Op, x: str, y: str, wname: str) -> None:
    """y = x @ W.T for a weight kept as float32 in the small-tensor buffer (too narrow for the matvec/GEMM:
    fewer than 32 or a non-multiple of 32 columns, as in the tiny test checkpoints)."""
    rows, cols = b.backend.small_matrix(wname)
    if b.widths[x] != cols:
        raise UnsupportedOpError(f"op {op.name}: weight {wname} has {cols} columns, input has {b.widths[x]}")
    dispatch(b, op, "MATMUL_SMALL", (-(-rows // _wg(b)), b.rows(x), 1), [x], [y], a_off=b.ref(x),
             a_stride=b.widths[x], y_off=b.ref(y), y_stride=b.widths[y], width=cols, n=rows,
             w_off=b.backend.small_offset(wname))  # fmt: skip
