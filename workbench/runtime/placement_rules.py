"""Op -> device assignment: the named strategies (:data:`~workbench.runtime.placement_platforms.STRATEGY_SPLITS`)
and custom placements, ``custom:`` rules that send blocks, layers, op kinds or single ops to devices.

    custom:attn=npu                          attention blocks on the NPU, the rest on the iGPU
    custom:all=cpu,ffn=npu                   FFN blocks on the NPU, the rest on the host CPU
    custom:layers:0-5=npu,kind:attention=npu layers 0..5 and every attention op on the NPU
    custom:prefill/all=npu                   prefill on the NPU, decode on the iGPU

Rules apply left to right, a later rule overriding earlier ones for the ops it selects; ops no rule selects
run on the iGPU (``vulkan``). Selectors: ``all``; ``attn``, ``ffn``, ``other`` (the blocks of the named
strategies); ``layers:A-B`` or ``layers:N``; ``kind:KIND``; ``op:NAME`` (a full op name such as
``blk.3.ffn_down`` or ``lm_head``). A ``prefill/`` or ``decode/`` prefix limits a rule to that phase.
The NPU takes only the kinds its schedules cover: a ``kind:`` or ``op:`` rule that sends another kind to
the ``npu`` is an error; a block, layer or ``all`` rule leaves such ops where earlier rules put them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ops.graph import Graph, Op
from .placement_platforms import STRATEGIES, STRATEGY_SPLITS

PREFIX = "custom:"
DEVICES = ("cpu", "vulkan", "npu")
DEFAULT_DEVICE = "vulkan"
ATTN_BLOCK = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "rope_q", "rope_k",
              "attn", "attn_output", "post_attention_norm", "attn_residual")  # fmt: skip
FFN_BLOCK = ("ffn_norm", "ffn_gate", "ffn_up", "ffn_act", "ffn_down", "post_ffw_norm", "ffn_residual")
BLOCKS = ("all", "attn", "ffn", "other")
PHASES = ("prefill", "decode")


def block_of(op: Op) -> str:
    """``attn``, ``ffn`` or ``other`` (embedding, final norm, head): the op's block in a layer."""
    part = op.name.split(".")[-1] if op.layer is not None else ""
    return "attn" if part in ATTN_BLOCK else "ffn" if part in FFN_BLOCK else "other"


@dataclass(frozen=True)
class Rule:
    """One ``[phase/]selector=device`` rule."""

    phase: str | None
    selector: str  # all | attn | ffn | other | layers | kind | op
    arg: str
    device: str
    first: int = 0
    last: int = -1

    def selects(self, op: Op, phase: str) -> bool:
        if self.phase is not None and self.phase != phase:
            return False
        if self.selector == "all":
            return True
        if self.selector in ("attn", "ffn", "other"):
            return block_of(op) == self.selector
        if self.selector == "layers":
            return op.layer is not None and self.first <= op.layer <= self.last
        if self.selector == "kind":
            return op.kind == self.arg
        return op.name == self.arg

    @property
    def explicit(self) -> bool:
        """Whether the rule names op kinds or ops (so an NPU that cannot run them is the user's error)."""
        return self.selector in ("kind", "op")


def is_custom(strategy: str) -> bool:
    return strategy.startswith(PREFIX)


def _layers(arg: str, text: str) -> tuple[int, int]:
    lo, _, hi = arg.partition("-")
    try:
        first, last = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"placement rule {text!r}: layers takes N or A-B, got {arg!r}") from None
    if not 0 <= first <= last:
        raise ValueError(f"placement rule {text!r}: layer range {arg!r} is empty or negative")
    return first, last


def parse_rules(strategy: str) -> list[Rule]:
    """The rules of a ``custom:...`` strategy (see the module docstring), each checked."""
    if not is_custom(strategy):
        raise ValueError(f"a custom placement starts with {PREFIX!r}, got {strategy!r}")
    texts = [t.strip() for t in strategy[len(PREFIX) :].split(",") if t.strip()]
    if not texts:
        raise ValueError(f"custom placement {strategy!r} has no rules (e.g. custom:attn=npu)")
    rules = []
    for text in texts:
        target, eq, device = text.rpartition("=")
        if not eq or not target:
            raise ValueError(f"placement rule {text!r} is not SELECTOR=DEVICE")
        if device not in DEVICES:
            raise ValueError(f"placement rule {text!r}: device must be one of {', '.join(DEVICES)}")
        phase, slash, sel = target.rpartition("/")
        if slash and phase not in PHASES:
            raise ValueError(f"placement rule {text!r}: phase prefix must be prefill/ or decode/")
        kind, colon, arg = sel.partition(":")
        first, last = 0, -1
        if not colon and kind in BLOCKS:
            pass
        elif colon and kind == "layers":
            first, last = _layers(arg, text)
        elif colon and kind in ("kind", "op") and arg:
            pass
        else:
            raise ValueError(
                f"placement rule {text!r}: selector must be all, attn, ffn, other, layers:A-B, kind:KIND or op:NAME"
            )
        rules.append(Rule(phase or None, kind, arg, device, first, last))
    return rules


def assign_rules(graph: Graph, strategy: str, phase: str, npu_kinds: tuple[str, ...]) -> dict[str, str]:
    """Op name -> device for a ``custom:`` strategy on ``graph`` in ``phase``."""
    rules = parse_rules(strategy)
    names = {op.name for op in graph.ops}
    kinds = set(graph.kinds())
    for r in rules:
        if r.selector == "op" and r.arg not in names:
            raise ValueError(f"placement rule op:{r.arg}: no op of that name (e.g. blk.0.ffn_down, lm_head)")
        if r.selector == "kind" and r.arg not in kinds:
            raise ValueError(
                f"placement rule kind:{r.arg}: the graph has no such kind ({', '.join(sorted(kinds))})"
            )
        if r.explicit and r.device == "npu" and r.selector == "kind" and r.arg not in npu_kinds:
            raise ValueError(
                f"placement rule kind:{r.arg}=npu: the NPU schedules cover {', '.join(npu_kinds)}"
            )
        if r.selector == "layers" and r.last >= graph.config.n_layers:
            raise ValueError(
                f"placement rule layers:{r.first}-{r.last}: the model has {graph.config.n_layers} layers"
            )
    out = {}
    for op in graph.ops:
        dev = DEFAULT_DEVICE
        for r in rules:
            if not r.selects(op, phase):
                continue
            if r.device == "npu" and op.kind not in npu_kinds:
                if r.explicit:
                    raise ValueError(
                        f"placement rule op:{op.name}=npu: its kind {op.kind!r} has no NPU schedule"
                    )
                continue
            dev = r.device
        out[op.name] = dev
    return out


def assign(graph: Graph, strategy: str, phase: str = "decode", first_n: int | None = None) -> dict[str, str]:
    """Op name -> device for ``strategy``: a name of :data:`~workbench.runtime.placement_platforms.STRATEGIES`
    or ``custom:`` rules; ``phase`` is prefill or decode."""
    from ..backends.npu import NPU_KINDS

    if is_custom(strategy):
        return assign_rules(graph, strategy, phase, NPU_KINDS)
    if strategy not in STRATEGIES:
        raise ValueError(
            f"unknown placement strategy {strategy!r} (known: {', '.join(STRATEGIES)}, or custom:RULES)"
        )
    n = graph.config.n_layers // 2 if first_n is None else first_n
    if not 0 <= n <= graph.config.n_layers:
        raise ValueError(f"first_n must be in 0..{graph.config.n_layers}, got {first_n}")
    split = STRATEGY_SPLITS[strategy]

    def wants_npu(op: Op) -> bool:
        if split.npu in ("attn", "ffn"):
            return block_of(op) == split.npu
        if split.npu == "first-n":
            return op.layer is not None and op.layer < n
        return split.npu == "prefill" and phase == "prefill"

    return {op.name: "npu" if wants_npu(op) and op.kind in NPU_KINDS else split.other for op in graph.ops}
