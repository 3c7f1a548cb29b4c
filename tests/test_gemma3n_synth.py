"""Synthetic Gemma 3n (E2B/E4B): llama-quantize's Q4_K_M plan, a small-scale write that round-trips
through the loader, and ``workbench limits``' bytes per decoded token (the per-layer table gathered by
row, the sharing layers' unused K/V never read)."""

from __future__ import annotations

import numpy as np
import pytest

import workbench as wb
from workbench.instrument.roofline import limits, weight_specs_for
from workbench.models import synth
from workbench.models.architectures import build_graph
from workbench.models.config import preset
from workbench.models.gguf import GGUFFile
from workbench.ops.kinds import op_cost
from workbench.quant.formats import FORMATS, GGMLType


def test_e2b_e4b_presets_have_llama_cpp_hard_coded_values():
    """llama.cpp hard-codes 20 layers owning a KV cache, per-layer width 256 and LAuReL rank 64."""
    for name, layers, ffn in (("gemma3n-e2b", 30, 8192), ("gemma3n-e4b", 35, 16384)):
        c = preset(name)
        assert (c.n_layers, c.ffn, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim) == (
            layers,
            ffn,
            2048,
            8,
            2,
            256,
        )
        assert sum(c.owns_kv(i) for i in range(c.n_layers)) == 20 and c.ple_dim == 256 and c.laurel_rank == 64
        assert [c.kv_layer(i) for i in range(20, c.n_layers)] == [
            19 if (i + 1) % 5 == 0 else 18 for i in range(20, c.n_layers)
        ]
        assert c.activation_sparsity[:10] == (0.95,) * 10 and not any(c.activation_sparsity[10:])


def test_e2b_q4_k_m_plan_is_llama_quantize_s():
    c = preset("gemma3n-e2b")
    plan = synth.quant_plan(c, "q4_k_m")
    assert plan["token_embd.weight"] == GGMLType.Q6_K  # tied to the output
    assert plan["per_layer_token_embd.weight"] == GGMLType.Q6_K  # llama.cpp's "token_embd" category
    for kept in ("altup_proj", "altup_unembd_proj", "per_layer_model_proj"):
        assert plan[f"{kept}.weight"] == GGMLType.F16
    for kept in ("altup_router", "laurel_l", "laurel_r"):
        assert plan[f"blk.3.{kept}.weight"] == GGMLType.F16
    assert plan["blk.3.altup_predict_coef.weight"] == plan["blk.3.altup_correct_coef.weight"] == GGMLType.F32
    assert plan["blk.3.inp_gate.weight"] == plan["blk.3.proj.weight"] == GGMLType.Q4_K
    more = {i for i in range(30) if i < 3 or i >= 26 or (i - 3) % 3 == 2}  # llama.cpp's use_more_bits(i, 30)
    assert {i for i in range(30) if plan[f"blk.{i}.ffn_down.weight"] == GGMLType.Q6_K} == more
    assert {i for i in range(30) if plan[f"blk.{i}.attn_v.weight"] == GGMLType.Q6_K} == more
    # the sharing layers carry K/V projections (llama.cpp's loader requires them); the graph never reads them
    assert "blk.25.attn_k.weight" in plan and "blk.25.attn_k_norm.weight" in plan
    norms = [n for n in plan if n.split(".")[-2].endswith("norm") or n.endswith("correct_scale.weight")]
    assert all(plan[n] == GGMLType.F32 for n in norms)
    total = sum(
        FORMATS[t].nbytes(int(np.prod(s))) for (n, t), s in zip(plan.items(), synth.file_weights(c).values())
    )
    assert 3.1e9 < total < 3.5e9  # published E2B Q4_K_M GGUFs of the text decoder: ~3.3 GB


def _small_e2b():
    """E2B's pattern at a size a test can write: 25 layers (20 own a cache, llama.cpp's count), hidden 256."""
    return preset("gemma3n-e2b").with_(
        name="gemma3n-small", n_layers=25, hidden=256, ffn=512, vocab_size=512, ple_vocab_size=512,
        kv_shared_layers=5, activation_sparsity=(0.95,) * 10 + (0.0,) * 15,
    )  # fmt: skip


def test_small_scale_write_round_trips(tmp_path, monkeypatch):
    """The writer streams big tensors in blocks (forced here), and the file loads back as the same model."""
    monkeypatch.setattr(synth, "CHUNK_BYTES", 1 << 14)
    config = _small_e2b()
    path = synth.write_synthetic(config, "q4_k_m", tmp_path / "s.gguf", progress=False, vocab="generated")
    f = GGUFFile(path)
    plan, shapes = synth.quant_plan(config, "q4_k_m"), synth.file_weights(config)
    assert {n: t.type for n, t in f.tensors.items()} == plan
    model = wb.load(path)
    assert model.synthetic and model.config.arch == "gemma3n"
    assert np.allclose(
        model.config.activation_sparsity, config.activation_sparsity, atol=1e-7
    )  # via f32 Phi^-1
    for field in ("n_layers", "hidden", "ffn", "kv_shared_layers", "layer_types",
                  "ple_dim", "laurel_rank", "vocab_size", "ple_vocab_size", "final_logit_softcap"):  # fmt: skip
        assert getattr(model.config, field) == getattr(config, field), field
    table = model.weights["per_layer_token_embd.weight"]
    assert table.shape[0] == 512 and table.nbytes == FORMATS[GGMLType.Q6_K].nbytes(
        512 * shapes["per_layer_token_embd.weight"][1]
    )
    again = synth.write_synthetic(config, "q4_k_m", tmp_path / "t.gguf", progress=False, vocab="generated")
    assert again.read_bytes() == path.read_bytes()  # deterministic, chunked or not
    e = wb.Engine(model, "numpy")
    logits = e.forward(e.new_sequence(), [2, 17, 99])
    assert np.isfinite(logits).all()


def test_limits_count_the_ple_gather_not_the_table():
    c = preset("gemma3n-e2b")
    specs = weight_specs_for(c, "q4_k_m")
    lim = limits(c, specs, "780m", context=512)
    table = specs["per_layer_token_embd.weight"].nbytes
    unused = sum(s.nbytes for n, s in specs.items() if n.startswith("blk.2") and n.split(".")[1] >= "20"
                 and n.split(".")[2] in ("attn_k", "attn_v"))  # fmt: skip
    graph = build_graph(c, specs, 1, 1)
    row = op_cost(graph.op("ple_embed"), graph, np.array([511])).bytes_read
    assert row <= 2 * table / c.ple_vocab_size  # one row of L*P values
    streamed = sum(s.nbytes for s in specs.values()) - table - unused
    # + the K/V each attention reads (63 MB at 512 tokens, fp32; sharing layers read their owner's) and activations
    assert streamed < lim.decode_bytes_per_token < streamed + 100e6
    assert not any(op.name.startswith("blk.25.attn_k") for op in graph.ops)
    assert 45 < lim.decode_tok_s < 60  # the 780M profile's bandwidth over E2B's bytes a token (not the table)


@pytest.mark.parametrize("name", ["gemma3n-e2b", "gemma3n-e4b"])
def test_limits_cli_takes_the_presets(name, capsys):
    from workbench.cli import main

    assert main(["limits", "-m", name, "-d", "780m", "--json"]) == 0
    assert name in capsys.readouterr().out


def test_placement_of_e2b_with_and_without_the_sparse_skip():
    """E2B's graph places (the seeds' plan: layers 0-9 on the NPU); the projected skip of the sparse layers'
    up/down units speeds decode on every device and leaves Gemma 3 and prefill alone."""
    from workbench.runtime.placement import kept_units, project

    c = preset("gemma3n-e2b")
    specs = weight_specs_for(c, "q4_k_m")
    graph = build_graph(c, specs, 1, 1)
    assert kept_units(graph.op("blk.0.ffn_up"), graph) == 448  # 8192 * 0.05 = 409.6, rounded up to 64s
    assert (
        kept_units(graph.op("blk.10.ffn_up"), graph) is None
        and kept_units(graph.op("blk.0.ffn_gate"), graph) is None
    )
    for strategy, first_n in (("all-igpu", None), ("npu-first-N-layers", 10)):
        dense = project(c, specs, strategy, first_n=first_n)
        skip = project(c, specs, strategy, first_n=first_n, sparse_skip=True)
        assert skip.tokens_per_s > 1.05 * dense.tokens_per_s
        assert any("sparse skip projected" in t.how for t in skip.tasks)
    pre = [
        project(c, specs, "all-igpu", "prefill", prompt_tokens=64, sparse_skip=s).tokens_per_s
        for s in (False, True)
    ]
    assert pre[0] == pre[1]
    g3 = preset("gemma3-270m")
    g3_specs = weight_specs_for(g3, "q4_k_m")
    assert (
        project(g3, g3_specs, "all-igpu").tokens_per_s
        == project(g3, g3_specs, "all-igpu", sparse_skip=True).tokens_per_s
    )
