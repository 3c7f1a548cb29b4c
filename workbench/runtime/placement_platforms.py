"""Placement data: the machines a placement is projected for, the figures its projections assume, and the
named split strategies (:data:`STRATEGY_SPLITS`), as data that :func:`workbench.runtime.placement_rules.assign`
reads. Sources of the figures: docs/architecture.md#projections.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..instrument.devices import DeviceProfile, get_profile

# roofline efficiency of projected GPU/CPU ops: the share of peak bandwidth and FLOP/s a projection assumes,
# and the cost of one dispatch of a recorded command buffer (sources and figures: docs/architecture.md#projections)
BW_EFFICIENCY = 0.85
FLOP_EFFICIENCY = 0.5
DISPATCH_S = 5e-6
# transfers (assumed, see docs/architecture.md#projections): zero-copy on unified memory costs a cache flush
# at memory bandwidth plus a queue sync; devices with separate memory copy over PCIe at PCIE_BW per copy
SYNC_S = 10e-6
PCIE_BW, PCIE_LATENCY_S = 25e9, 10e-6
# bytes per cached K or V value when the cache moves between devices (fp16/bf16 caches)
KV_BYTES = 2
# a sparse layer's decode skipping (Gemma 3n): the projections it reads only in part, and the shape its kept
# units are rounded up to (one NPU designs take)
SPARSE_KINDS = ("ffn_up", "ffn_down")
SPARSE_ROUND = 64


@dataclass(frozen=True)
class Split:
    """A named strategy: which ops go to the NPU (only the kinds it covers) and where every other op runs.

    ``npu``: ``none``, ``attn`` or ``ffn`` (that block of every layer), ``first-n`` (layers 0..N-1) or
    ``prefill`` (every op of a prefill step)."""

    description: str
    npu: str = "none"
    other: str = "vulkan"


STRATEGY_SPLITS = {
    "all-igpu": Split("every op on the iGPU"),
    "npu-attention": Split(
        "attention blocks on the NPU (the kinds it covers), FFN blocks and the rest on the iGPU", "attn"
    ),
    "npu-ffn": Split(
        "FFN blocks on the NPU (the kinds it covers), attention blocks and the rest on the iGPU", "ffn"
    ),
    "npu-first-N-layers": Split(
        "layers 0..N-1 on the NPU (the kinds it covers), the rest on the iGPU (N: first_n)", "first-n"
    ),
    "npu-prefill-igpu-decode": Split(
        "prefill steps on the NPU (the kinds it covers), decode steps on the iGPU (AMD's hybrid flow)",
        "prefill",
    ),
    "all-cpu": Split("every op on the host CPU (the baseline this machine can measure)", other="cpu"),
}
STRATEGIES = {name: split.description for name, split in STRATEGY_SPLITS.items()}


@dataclass(frozen=True)
class Platform:
    """The machine a placement is projected for: the device profile behind each device name."""

    name: str
    profiles: dict[str, str]

    def profile(self, device: str) -> DeviceProfile:
        return get_profile(self.profiles[device])

    def unified(self, a: str, b: str) -> bool:
        return self.profile(a).unified_memory and self.profile(b).unified_memory


PLATFORMS = {
    "phoenix": Platform("phoenix", {"cpu": "host", "vulkan": "780m", "npu": "npu1"}),
    "hawkpoint": Platform("hawkpoint", {"cpu": "host", "vulkan": "780m", "npu": "hawkpoint"}),
    "strix": Platform("strix", {"cpu": "host", "vulkan": "890m", "npu": "npu2"}),
    "h100+npu1": Platform("h100+npu1", {"cpu": "host", "vulkan": "h100", "npu": "npu1"}),
}


def get_platform(name: str) -> Platform:
    try:
        return PLATFORMS[name]
    except KeyError:
        raise ValueError(f"unknown platform {name!r} (known: {', '.join(PLATFORMS)})") from None
