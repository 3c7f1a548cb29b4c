"""Barrier placement of the Vulkan programs (no device needed): by memory, since the arena reuses space."""

from __future__ import annotations

from workbench.backends.vulkan.program import memory_clash

SPANS = {"a": (0, 64), "b": (0, 64), "c": (64, 128), "kv": (128, 256)}  # b took a's space after a died


def test_names_that_share_memory_clash():
    assert memory_clash(
        {"b"}, {"a"}, SPANS
    )  # writing b while a dispatch still reads a: a race without a barrier
    assert not memory_clash({"c"}, {"a"}, SPANS)


def test_row_ranges_of_one_tensor_do_not_clash():
    """``x#i`` are disjoint row ranges of ``x`` (sequence groups of a batch): no barrier between them."""
    assert not memory_clash({"kv#0"}, {"kv#1"}, SPANS)
    assert memory_clash({"kv"}, {"kv#1"}, SPANS)


def test_tensors_outside_the_arena_clash_by_name_only():
    assert memory_clash({"weights"}, {"weights"}, SPANS)
    assert not memory_clash({"weights"}, {"a"}, SPANS)
