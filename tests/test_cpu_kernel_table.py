"""The cpu backend's kernel table (workbench.backends.numba_cpu.kernel_table) and its generated dispatcher."""

from __future__ import annotations

from workbench.backends.numba_cpu import dispatch, kernel_table
from workbench.backends.numba_cpu.kernel_table import DISPATCHES, KERNELS, LAYOUT_NAMES, kernel_name, render
from workbench.backends.numba_cpu.matvec import QUANT_FMTS, R16_FMTS


def test_dispatch_file_is_generated_from_the_table():
    assert kernel_table.DISPATCH_FILE.read_text() == render(), (
        "dispatch.py is out of date: run `python -m workbench.backends.numba_cpu.kernel_table`"
    )


def test_every_kernel_of_the_table_is_in_the_dispatcher():
    for fmt, kind in KERNELS:
        assert hasattr(getattr(dispatch, kernel_name(fmt, kind)), "_defn"), (fmt, kind)
    for d in DISPATCHES:
        assert callable(getattr(dispatch, d.name))


def test_every_weight_layout_has_its_row_kernels():
    """Each block layout the backend stores has an int16, a float, a dequantizing and both batched kernels;
    each interleaved layout its 16-row kernel."""
    kinds = {}
    for fmt, kind in KERNELS:
        kinds.setdefault(fmt, set()).add(kind)
    assert set(kinds) == set(QUANT_FMTS) == set(LAYOUT_NAMES)
    for fmt, have in kinds.items():
        want = {"i16_x16"} if fmt in R16_FMTS else {"i16", "f32", "dequant", "f32_rows8", "i16_rows8"}
        assert want <= have, (LAYOUT_NAMES[fmt], have)


def test_a_new_table_row_changes_the_dispatcher(monkeypatch):
    """Adding a layout is one row: the rendered dispatcher then tests for it and calls its kernel."""
    before = render()
    monkeypatch.setitem(KERNELS, (9999, "f32"), lambda: None)
    monkeypatch.setitem(LAYOUT_NAMES, 9999, "new_layout")
    text = render()
    assert 'f32_new_layout = _K["f32_new_layout"]' in text and "NEW_LAYOUT = 9999" in text
    assert "f32_new_layout(wa + n * rb, xp, s, n_units)" in text  # the last layout of a kind: its else branch
    assert text.count("elif fmt ==") == before.count("elif fmt ==") + 1
