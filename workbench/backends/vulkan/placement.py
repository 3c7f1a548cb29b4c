"""Where the weights go: device-local memory while they fit, then host-visible memory; decided before
anything is uploaded, and reported per heap.

Tunables (``--tune``): ``weights.heap=auto|device|host`` (default ``auto``) and ``weights.device_budget_mb=N``
(the device-local MiB the weights may take: emulates a small carve-out on any device).

- ``auto``: weights in model order, each into device-local memory if it fits what is left of the weights'
  device budget, else into host-visible memory (first fit: a later, smaller weight may still fill the rest).
  In a decode step every matrix is read once per token, so the host-visible bytes read per token are the
  bytes placed there whatever the order; first fit keeps the device budget nearly full and the split
  deterministic. The budget is ``weights.device_budget_mb`` if given (at most the heap's free budget), else
  the device-local heap's free budget less a reserve for the KV cache and the activations: a quarter of
  it, at most 1 GiB.
- ``device``: every weight device-local (the heap's free budget, or ``weights.device_budget_mb``).
- ``host``: every weight in host-visible memory (what the weights cost there: forced on a discrete GPU).

Weights that fit no heap are an error naming the sizes, raised before the first upload. The KV cache and
the activation arenas are allocated later, device-local while the heap's budget has room, host-visible
after that (:class:`.memory.Buffer`'s ``spill``, said on stderr); when neither heap has room, their
allocation is a :class:`.device.DeviceOutOfMemoryError` naming every heap.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .device import DeviceOutOfMemoryError, VulkanDevice
from .heaps import Heap, read_heaps, size_text
from .memory import role_type
from .weights import DeviceWeight

HEAP_MODES = ("auto", "device", "host")
RESERVE_MAX = 1 << 30  # the most of the device-local budget auto keeps for the KV cache and activations
TUNABLES = ("weights.heap", "weights.device_budget_mb")


@dataclass(frozen=True)
class WeightsPlan:
    """Each weight's memory role (``device`` or ``host``) and what the decision saw."""

    mode: str
    roles: dict[str, str]
    device_budget: int  # bytes the weights could take device-local
    heaps: tuple[Heap, ...]  # every heap before the weights were uploaded
    device_heap: int
    host_heap: int
    budget_source: str


def check_tunables(mode: str, budget_mb: str | None) -> int | None:
    """``weights.heap`` checked, and ``weights.device_budget_mb`` in bytes (None: not given)."""
    if mode not in HEAP_MODES:
        raise ValueError(f"vulkan backend: weights.heap={mode!r} is not one of {', '.join(HEAP_MODES)}")
    if budget_mb is None:
        return None
    try:
        mb = int(budget_mb)
    except ValueError:
        mb = -1
    if mb < 0:
        raise ValueError(
            f"vulkan backend: weights.device_budget_mb={budget_mb!r} is not a whole number of MiB (>= 0)"
        )
    return mb << 20


def assign(
    sizes: dict[str, int], mode: str, budget: int | None, device: Heap, host: Heap
) -> tuple[dict[str, str], int]:
    """Each weight's role and the weights' device budget in bytes (see the module's docstring); a
    :class:`DeviceOutOfMemoryError` naming the sizes when they fit no heap. ``sizes``: bytes per weight in
    model order; ``device``/``host``: the heaps of the two roles (the same heap on some devices)."""
    total = sum(sizes.values())
    room = device.free
    if budget is not None:
        room = min(budget, room)
    elif mode == "auto":
        room -= min(RESERVE_MAX, room // 4)
    elif mode == "host":
        room = 0
    if mode == "device" and total > room:
        given = f" (weights.device_budget_mb={budget >> 20})" if budget is not None else ""
        raise DeviceOutOfMemoryError(
            f"weights.heap=device: the weights take {size_text(total)}, more than the {size_text(room)}{given} "
            f"they may take on the {device.describe()}; weights.heap=auto puts the rest in host-visible "
            "memory"
        )
    roles, left = {}, room
    for name, n in sizes.items():
        roles[name] = "device" if n <= left else "host"
        left -= n if roles[name] == "device" else 0
    on_device = sum(n for name, n in sizes.items() if roles[name] == "device")
    on_host = total - on_device
    host_room = host.free - (on_device if host.index == device.index else 0)
    if on_host > host_room:
        raise DeviceOutOfMemoryError(
            f"weights.heap={mode}: the weights ({size_text(total)}) fit no heap: {size_text(on_device)} of "
            f"them on the {device.describe()} (the weights' device budget: {size_text(room)}), "
            f"{size_text(on_host)} left for the {host.describe()}, which has {size_text(host_room)} free"
        )
    return roles, room


def plan_weights(dev: VulkanDevice, sizes: dict[str, int], mode: str, budget: int | None) -> WeightsPlan:
    """The placement of ``sizes`` (bytes per weight, model order) on ``dev`` given its heaps now."""
    heaps, source = read_heaps(dev)
    d, h = role_type(dev, "device").heap, role_type(dev, "host").heap
    roles, room = assign(sizes, mode, budget, heaps[d], heaps[h])
    return WeightsPlan(mode, roles, room, tuple(heaps), d, h, source)


def report(plan: WeightsPlan | None, weights: Iterable[DeviceWeight], dev: VulkanDevice) -> dict[str, Any]:
    """The device details' ``memory`` entry: bytes of weights per heap and role, the budgets seen (empty
    before the weights are placed)."""
    if plan is None:
        return {}
    placed: dict[tuple[int, str], int] = {}
    for w in weights:
        for p in w.parts:
            placed[(p.buffer.heap, w.role)] = placed.get((p.buffer.heap, w.role), 0) + p.buffer.size
    by_role = {r: sum(n for (_, rr), n in placed.items() if rr == r) for r in ("device", "host")}
    return {
        "weights_heap": plan.mode,
        "weights_device_budget": plan.device_budget,
        "weights_device_local_bytes": by_role["device"],
        "weights_host_visible_bytes": by_role["host"],
        "spilled_bytes": dev.spilled,  # KV cache / activations that went to host-visible memory
        "budget_source": plan.budget_source,
        "heaps": [
            {
                "heap": h.index,
                "device_local": h.device_local,
                "roles": [
                    r for r, i in (("device", plan.device_heap), ("host", plan.host_heap)) if i == h.index
                ],
                "size": h.size,
                "budget": h.budget,
                "used_before_weights": h.used,
                "weights_device_local_bytes": placed.get((h.index, "device"), 0),
                "weights_host_visible_bytes": placed.get((h.index, "host"), 0),
                "allocated_bytes": dev.allocated.get(h.index, 0),
            }
            for h in plan.heaps
        ],
    }
