"""Planar weight formats, mixed-precision specs, re-quantization, and their execution on numpy and cpu."""

from __future__ import annotations

import numpy as np
import pytest
from quant_models import forward_logits, tiny_model

from workbench.quant.planar import (
    FormatError,
    PlanarFormat,
    dequantize_planes,
    fake_quant_rows_int8,
    parse_format,
    quantize,
)
from workbench.quant.requant import requantize
from workbench.quant.spec import SpecError, parse_spec

RNG = np.random.default_rng(0)
W = RNG.standard_normal((48, 256)).astype(np.float32)


@pytest.mark.parametrize(
    "text, name, bits",
    [("fp32", "fp32", 32), ("FP16", "fp16", 16), ("bf16", "bf16", 16), ("int8", "int8", 8 + 32 / 256),
     ("int4-g32", "int4-g32", 4.5), ("int4-g128-asym", "int4-g128-asym", 4 + 24 / 128), ("int8+a8", "int8+a8", 8 + 32 / 256)],
)  # fmt: skip
def test_format_names_and_sizes(text, name, bits):
    fmt = parse_format(text)
    assert fmt.name == name
    assert fmt.bits_per_weight(256) == pytest.approx(bits)


@pytest.mark.parametrize(
    "text, message",
    [("int4-g48", "invalid group size 48"), ("int4-g0", "invalid group size"), ("fp16+a8", "+a8"),
     ("int3", "unknown weight format"), ("", "unknown weight format")],
)  # fmt: skip
def test_bad_formats(text, message):
    with pytest.raises(FormatError, match=message.replace("+", r"\+")):
        parse_format(text)


def test_columns_must_divide_into_groups():
    with pytest.raises(FormatError, match="not a multiple of the group size 64"):
        quantize(np.ones((4, 96), np.float32), parse_format("int4-g64"), "w")


@pytest.mark.parametrize("text", ["fp32", "fp16", "bf16", "int8", "int4-g32", "int4-g64-asym", "int4-g128"])
def test_round_trip_error_bounds(text):
    fmt = parse_format(text)
    planes = quantize(W, fmt)
    got = dequantize_planes(planes, fmt)
    err = np.abs(got - W)
    if fmt.kind == "fp32":
        assert err.max() == 0
    elif fmt.kind == "fp16":
        np.testing.assert_array_equal(got, W.astype(np.float16).astype(np.float32))
    elif fmt.kind == "bf16":
        assert (err <= np.abs(W) * 2.0**-8).all()
    elif fmt.kind == "int8":
        assert (err <= planes["scale"][:, None] * 0.5 + 1e-7).all()
        assert planes["q"].dtype == np.int8 and planes["scale"].shape == (48,)
    else:
        g = fmt.group
        scale = planes["scale"].astype(np.float32)
        assert planes["q"].shape == (48, 128) and scale.shape == (48, 256 // g)
        step = (
            1.0 if fmt.symmetric else 0.5
        )  # symmetric: the extreme maps to -8, so +extreme clips to 7 (a step)
        bound = np.repeat(np.abs(scale), g, axis=1) * step + 1e-3 * np.abs(W)
        assert (err <= bound).all()


def test_int4_planar_layout_split_halves():
    """Byte i of group j holds value j*G+i in its low nibble and value j*G+G/2+i in its high nibble."""
    fmt = parse_format("int4-g32")
    w = np.zeros((1, 64), np.float32)
    w[0, 0], w[0, 16], w[0, 32] = -8.0, 7.0, 4.0
    planes = quantize(w, fmt)
    q = planes["q"][0]
    assert q[0] & 15 == 0 and q[0] >> 4 == 15  # -8 -> code 0 (low), +7 -> code 15 (high)
    assert q[16] & 15 == 8 + round(4.0 / float(planes["scale"][0, 1]))  # value 32 starts group 1 at byte 16
    assert float(planes["scale"][0, 0]) == 1.0


def test_mixed_precision_spec_resolves_per_kind_and_layer():
    spec = parse_spec("int4-g32,ffn_down=int8,attn@0-1=fp16,embed=native", n_layers=3)
    assert spec.format_for("blk.2.ffn_gate.weight") == PlanarFormat("int4", 32)
    assert spec.format_for("blk.0.ffn_down.weight").name == "int8"
    assert spec.format_for("blk.1.attn_q.weight").name == "fp16"
    assert spec.format_for("blk.2.attn_q.weight").name == "int4-g32"
    assert spec.format_for("token_embd.weight") is None
    assert spec.format_for("blk.0.attn_norm.weight") is None


@pytest.mark.parametrize(
    "text, message",
    [("", "empty"), ("int8,fp16", "more than one default"), ("int8,ffn_foo=int8", "unknown weight"),
     ("int8,ffn@7=int4-g32", "layer 7 does not exist"), ("int8,ffn=int4-g33", "invalid group size"),
     ("int8,embed@1=fp16", "not a per-layer weight"), ("int8,ffn@3-1=fp16", "empty")],
)  # fmt: skip
def test_bad_specs(text, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(text, n_layers=3)


def test_requantize_says_what_the_source_was(tmp_path):
    exact = requantize(tiny_model(tmp_path, "F32"), "int8", progress=False)
    assert exact.notes["source_note"] == "re-quantized from float32 weights"
    q8 = requantize(tiny_model(tmp_path, "Q8_0"), "fp32", progress=False)
    assert "itself quantized" in q8.notes["source_note"] and "Q8_0" in q8.notes["source_note"]
    w = q8.weights["blk.0.ffn_up.weight"]
    assert w.type.name == "fp32" and w.source == "Q8_0"


def test_act8_rounds_each_token_to_127_levels():
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    q = fake_quant_rows_int8(x)
    s = np.abs(x).max(axis=1, keepdims=True) / 127
    np.testing.assert_allclose(q / s, np.rint(q / s), atol=1e-3)
    assert np.abs(q - x).max() <= s.max() / 2 + 1e-6


@pytest.mark.parametrize(
    "quant",
    [
        "fp32",
        "fp16",
        "bf16",
        "int8",
        "int4-g32",
        "int4-g64-asym,ffn_down=int4-g32-asym",
        "int4-g32,ffn_down=int8",
        "int8+a8",
    ],
)
def test_cpu_runs_planar_formats_like_the_numpy_oracle(tmp_path, quant):
    model = requantize(tiny_model(tmp_path, "Q8_0"), quant, progress=False)
    ref, got = forward_logits(model, "numpy"), forward_logits(model, "cpu")
    np.testing.assert_allclose(got, ref, atol=2e-3 * np.abs(ref).max())


def test_cpu_act8_matvec_matches_the_oracle_op(tmp_path):
    """+a8: the cpu's integer product equals the oracle's rounded activations times the weights (one op;
    whole-model logits may differ where an upstream float difference flips one rounding)."""
    import workbench as wb
    from workbench.backends.numba_cpu.qformats import PlanarWeight

    model = requantize(tiny_model(tmp_path, "Q8_0"), "int4-g32-asym+a8", progress=False)
    b = wb.Engine(model, "cpu").backend
    t = model.weights["blk.0.ffn_up.weight"]
    x = RNG.standard_normal((1, t.cols)).astype(np.float32)
    got = b.project_weights(x, [PlanarWeight(t)])[0]
    want = fake_quant_rows_int8(x) @ t.dequantize().T
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
