"""Weights on device-local or host-visible memory (``weights.heap``, ``weights.device_budget_mb``): memory
types per role on the heap layouts of a Radeon iGPU, an NVIDIA GPU and lavapipe; the placement rule; and on
the Vulkan device here (lavapipe: one heap, so a forced small device budget is how a small carve-out is
emulated) weights split between the two roles with logits equal to numpy's, forced host weights, a device
placement that does not fit, a model that fits no heap (both before any upload), invalid tunables.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from test_vulkan import REASON, SMALL, TOKENS, compare, vulkan_engine

import workbench as wb
from workbench.backends.vulkan.device import DeviceOutOfMemoryError
from workbench.backends.vulkan.heaps import (
    DEVICE_LOCAL,
    HOST_CACHED,
    HOST_COHERENT,
    HOST_VISIBLE,
    Heap,
    device_local_heaps,
    memory_types,
    pick_type,
)
from workbench.backends.vulkan.placement import RESERVE_MAX, assign
from workbench.models.synth import write_synthetic

needs_vulkan = pytest.mark.skipif(bool(REASON), reason=f"VULKAN TESTS SKIPPED: {REASON}")
MiB, GiB = 1 << 20, 1 << 30
HV = HOST_VISIBLE | HOST_COHERENT


def props(heaps: list[tuple[int, bool]], types: list[tuple[int, int]]) -> SimpleNamespace:
    """A ``VkPhysicalDeviceMemoryProperties`` look-alike: heaps (size, device-local), types (heap, flags)."""
    return SimpleNamespace(
        memoryHeapCount=len(heaps),
        memoryHeaps=[SimpleNamespace(size=s, flags=int(local)) for s, local in heaps],
        memoryTypeCount=len(types),
        memoryTypes=[SimpleNamespace(heapIndex=h, propertyFlags=f) for h, f in types],
    )


# what the drivers list (vulkaninfo): RADV on a Ryzen 7840U (carve-out 2 GiB, GTT), NVIDIA on an H100
# (80 GiB VRAM, system RAM, a 256 MiB BAR window), lavapipe (one heap, one type with every flag)
RADV_780M = props(
    [(2 * GiB, True), (30 * GiB, False), (256 * MiB, True)],
    [(0, DEVICE_LOCAL), (1, HV), (2, DEVICE_LOCAL | HV), (1, HV | HOST_CACHED)],
)
NVIDIA_H100 = props(
    [(80 * GiB, True), (128 * GiB, False), (256 * MiB, True)],
    [(1, 0), (0, DEVICE_LOCAL), (1, HV), (1, HV | HOST_CACHED), (2, DEVICE_LOCAL | HV)],
)
LAVAPIPE = props([(2 * GiB, True)], [(0, DEVICE_LOCAL | HV | HOST_CACHED)])


@pytest.mark.parametrize(
    "layout, device, host, staging",
    [
        (RADV_780M, (0, 0), (1, 1), (3, 1)),
        (NVIDIA_H100, (1, 0), (2, 1), (3, 1)),
        (LAVAPIPE, (0, 0), (0, 0), (0, 0)),
    ],
)
def test_memory_type_per_role(layout, device, host, staging):
    """device: the first device-local type; host: write-combined system memory off the device-local heaps
    (the type the GPU reads without snooping); staging: cached host memory. Pairs are (type, heap)."""
    types, local = memory_types(layout), device_local_heaps(layout)
    for role, want in (("device", device), ("host", host), ("staging", staging)):
        t = pick_type(types, (1 << len(types)) - 1, role, local)
        assert (t.index, t.heap) == want, role


def test_memory_type_honours_the_buffers_allowed_types():
    types, local = memory_types(NVIDIA_H100), device_local_heaps(NVIDIA_H100)
    assert pick_type(types, 0b11011, "host", local).index == 3  # no write-combined type: cached system memory
    assert pick_type(types, 0b10011, "host", local).index == 4  # only the BAR window is host-visible
    with pytest.raises(LookupError, match="no Vulkan memory type for host"):
        pick_type(types, 0b00011, "host", local)
    with pytest.raises(ValueError, match="unknown memory role"):
        pick_type(types, 0b11111, "vram", local)


def heap(index: int, free: int, device_local: bool = True, size: int = 64 * GiB) -> Heap:
    return Heap(index, size, device_local, budget=free + GiB, used=GiB)


SIZES = {"token_embd": 300, "blk.0.a": 100, "blk.0.b": 250, "blk.1.a": 100, "blk.1.b": 250}


def test_auto_fills_the_device_budget_first_fit_in_model_order():
    roles, room = assign(SIZES, "auto", 460, heap(0, 10_000), heap(1, 10_000, False))
    assert room == 460
    # 300 + 100 on the device; 250 does not fit the 60 left, nor does the second 250; the second 100 does not
    assert roles == {"token_embd": "device", "blk.0.a": "device", "blk.0.b": "host", "blk.1.a": "host",
                     "blk.1.b": "host"}  # fmt: skip
    roles, _ = assign(SIZES, "auto", 520, heap(0, 10_000), heap(1, 10_000, False))
    assert [n for n, r in roles.items() if r == "device"] == ["token_embd", "blk.0.a", "blk.1.a"]


def test_auto_budget_keeps_a_reserve_and_never_exceeds_the_heap():
    _, room = assign(SIZES, "auto", None, heap(0, 4 * GiB), heap(1, 10_000, False))
    assert room == 3 * GiB  # a quarter of a small carve-out kept for the KV cache and activations
    _, room = assign(SIZES, "auto", None, heap(0, 40 * GiB), heap(1, 10_000, False))
    assert room == 40 * GiB - RESERVE_MAX
    _, room = assign(SIZES, "auto", 10 * GiB, heap(0, 4 * GiB), heap(1, 10_000, False))
    assert room == 4 * GiB  # a budget above what the heap has left is cut to it
    roles, room = assign(SIZES, "host", None, heap(0, 4 * GiB), heap(1, 10_000, False))
    assert room == 0 and set(roles.values()) == {"host"}


def test_device_placement_that_does_not_fit_names_the_sizes():
    roles, _ = assign(SIZES, "device", None, heap(0, 1000), heap(1, 0, False))
    assert set(roles.values()) == {"device"}
    with pytest.raises(DeviceOutOfMemoryError, match=r"weights.heap=device: the weights take 0.0 MiB.*"
                       r"weights.device_budget_mb=0\).*device-local heap 0.*weights.heap=auto"):  # fmt: skip
        assign(SIZES, "device", 0, heap(0, 1000), heap(1, 10_000, False))


def test_weights_that_fit_no_heap_name_the_sizes():
    with pytest.raises(DeviceOutOfMemoryError, match=r"weights.heap=auto: the weights .* fit no heap: .* of "
                       r"them on the device-local heap 0 .* left for the host heap 1"):  # fmt: skip
        assign(SIZES, "auto", 500, heap(0, 10_000), heap(1, 400, False))
    with pytest.raises(DeviceOutOfMemoryError, match=r"weights\.heap=host: the weights"):
        assign(SIZES, "host", None, heap(0, 10_000), heap(1, 999, False))
    # one heap for both roles (lavapipe): what the device part takes is not free for the rest
    with pytest.raises(DeviceOutOfMemoryError, match="fit no heap"):
        assign(SIZES, "auto", 500, heap(0, 999), heap(0, 999))
    roles, _ = assign(SIZES, "auto", 500, heap(0, 1000), heap(0, 1000))
    assert [n for n, r in roles.items() if r == "host"] == ["blk.0.b", "blk.1.b"]


# -- on the Vulkan device ------------------------------------------------------------------------------------
F32 = dataclasses.replace(SMALL, name="f32")  # 5.1 MiB of matrices: a budget of whole MiB splits them


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory):
    return wb.load(
        str(write_synthetic(F32, "f32", tmp_path_factory.mktemp("heaps") / "f32.gguf", progress=False))
    )


def _host_weights(backend) -> list:
    return [w for w in backend._weights.values() if w.role == "host"]


@needs_vulkan
def test_small_device_budget_puts_the_rest_in_host_memory(f32_model):
    from workbench.backends.vulkan.memory import role_type
    from workbench.instrument import environment

    ev = compare(f32_model, TOKENS, tune="weights.device_budget_mb=2")
    b = ev.backend
    mem = b.device.details["memory"]
    on_dev, on_host = mem["weights_device_local_bytes"], mem["weights_host_visible_bytes"]
    assert 0 < on_dev <= 2 * MiB < on_host and on_dev + on_host == b.device.details["weights_bytes"]
    assert mem["weights_heap"] == "auto" and mem["weights_device_budget"] == 2 * MiB
    assert sum(h["weights_device_local_bytes"] + h["weights_host_visible_bytes"] for h in mem["heaps"]) == (
        on_dev + on_host
    )
    assert all(h["budget"] > 0 and h["size"] > 0 for h in mem["heaps"]) and mem["budget_source"]
    host_type = role_type(b.dev, "host")
    for w in _host_weights(b):  # mapped host-visible memory of the host role's type
        assert all(p.buffer.memory_type == host_type.index and p.buffer.array is not None for p in w.parts)
    assert host_type.flags & HOST_VISIBLE
    record = environment.capture(b)  # what a run record stores
    assert record["device"]["memory"]["weights_host_visible_bytes"] == on_host


@needs_vulkan
def test_forced_host_weights_match_numpy_in_parts(tmp_path, monkeypatch):
    """Every weight host-visible, quantized planes split into several parts each: logits equal numpy's and
    the sizes planned before the upload are those allocated."""
    from workbench.backends.vulkan import backend as vb
    from workbench.backends.vulkan import weights as vw

    monkeypatch.setattr(vb, "upload_weight", lambda t, tr, limit, role: vw.upload_weight(t, tr, 4096, role))
    monkeypatch.setattr(vb, "device_bytes", lambda t, limit: vw.device_bytes(t, 4096))
    model = wb.load(str(write_synthetic(SMALL, "q4_k_m", tmp_path / "q4.gguf", progress=False)))
    b = compare(model, TOKENS, tune="weights.heap=host").backend
    mem = b.device.details["memory"]
    assert mem["weights_device_local_bytes"] == 0 and mem["weights_device_budget"] == 0
    assert mem["weights_host_visible_bytes"] == b.device.details["weights_bytes"] > 0
    assert len(_host_weights(b)) == len(b._weights) and max(len(w.parts) for w in b._weights.values()) > 1
    for name, w in b._weights.items():
        assert vw.device_bytes(model.weights[name], 4096) == w.nbytes, name


@needs_vulkan
def test_greedy_tokens_with_split_weights_equal_numpy(f32_model):
    want = wb.Engine(f32_model, "numpy").generate(TOKENS[:5], max_tokens=6).output_ids
    ev = vulkan_engine(f32_model, tune="weights.device_budget_mb=3")
    assert ev.generate(TOKENS[:5], max_tokens=6).output_ids == want
    assert _host_weights(ev.backend)
    ev.backend.dev.check_validation()


def _count_uploads(monkeypatch) -> list:
    from workbench.backends.vulkan import backend as vb

    calls, real = [], vb.upload_weight
    monkeypatch.setattr(vb, "upload_weight", lambda *a: calls.append(a[0].name) or real(*a))
    return calls


@needs_vulkan
def test_device_weights_that_do_not_fit_fail_before_any_upload(f32_model, monkeypatch):
    calls = _count_uploads(monkeypatch)
    with pytest.raises(DeviceOutOfMemoryError, match=r"weights.heap=device: the weights take 5\.\d MiB, more "
                       r"than the 1.0 MiB \(weights.device_budget_mb=1\)"):  # fmt: skip
        vulkan_engine(f32_model, tune="weights.heap=device,weights.device_budget_mb=1")
    assert calls == []
    b = vulkan_engine(f32_model, tune="weights.heap=device").backend  # the heap's budget holds them
    assert b.device.details["memory"]["weights_host_visible_bytes"] == 0 and calls


@needs_vulkan
def test_a_model_that_fits_no_heap_fails_before_any_upload(f32_model, monkeypatch):
    from workbench.backends.vulkan import placement

    def small_heaps(dev):  # what a 4 MiB heap with 1 MiB in use would report
        return [Heap(0, 4 * MiB, True, 4 * MiB, MiB)], "test"

    monkeypatch.setattr(placement, "read_heaps", small_heaps)
    calls = _count_uploads(monkeypatch)
    with pytest.raises(DeviceOutOfMemoryError, match=r"the weights \(5\.\d MiB\) fit no heap"):
        vulkan_engine(f32_model)
    assert calls == []


@needs_vulkan
@pytest.mark.parametrize(
    "tune, words",
    [
        ("weights.heap=gpu", "weights.heap='gpu' is not one of auto, device, host"),
        ("weights.heap=", "weights.heap='' is not one of"),
        ("weights.device_budget_mb=-1", "weights.device_budget_mb='-1' is not a whole number of MiB"),
        ("weights.device_budget_mb=1.5", "weights.device_budget_mb='1.5' is not a whole number"),
        ("weights.device_budget_mb=lots", "is not a whole number"),
        ("weights.budget_mb=1", "unknown tunables"),
    ],
)
def test_invalid_weight_tunables_are_clear(f32_model, tune, words, monkeypatch):
    calls = _count_uploads(monkeypatch)
    with pytest.raises(ValueError, match=words):
        vulkan_engine(f32_model, tune=tune)
    assert calls == []


def test_planned_sizes_are_whole_padded_parts():
    """Without a device: the planned bytes of a weight are its planes padded to 16 bytes, per part."""
    from workbench.backends.vulkan.weights import device_bytes
    from workbench.models.weights import QTensor
    from workbench.quant.formats import GGMLType

    t = QTensor("w", GGMLType.Q8_0, (5, 64), lambda: np.zeros((5, 68), np.uint8))
    # Q8_0: a row is 2 blocks of 32 quants and an fp16 scale each: planes of 64 and 4 bytes a row
    assert device_bytes(t, 1 << 20) == 5 * 64 + 32  # one part: 320 + 20 padded to 32
    assert device_bytes(t, 64 * 16 + 68 * 2) == 2 * (128 + 16) + (64 + 16)  # parts of 2, 2 and 1 rows
