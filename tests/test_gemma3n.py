"""Gemma 3n's text decoder on the numpy reference, against Hugging Face transformers.

tests/fixtures/gemma3n/<name> are tiny random ``Gemma3nForCausalLM`` checkpoints (float16) and
tests/fixtures/gemma3n_transformers.json their transformers fp32 logits and greedy tokens, both made by
scripts/make_gemma3n_reference.py. ``e2b_pattern`` is E2B's layer pattern scaled down to 15 layers (global
every 5th, the last 5 sharing KV, the first 5 sparse); the others vary the heads, layer types, sharing,
sparsities, RoPE bases, eps and softcap. Then: the other directory layouts a Gemma 3n checkpoint comes in,
and the errors for bad input.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import gguf_edit
import numpy as np
import pytest
from gguf_edit import encode_value, read_parts
from safetensors_edit import join, split
from tiny import tiny_vocab

import workbench as wb
from workbench.backends import UnsupportedOpError, numpy_ref
from workbench.models.errors import ModelFormatError, UnsupportedModelError
from workbench.models.gguf_writer import write_gguf
from workbench.ops.kinds import op_cost, step_cost
from workbench.quant.formats import GGMLType

FIXTURES = Path(__file__).parent / "fixtures"
MODELS = ("e2b_pattern", "gqa_softcap", "shared_alternating")
LLAMA_CPP_LAYOUT = "llama_cpp_layout"  # only a GGUF: tests/test_gemma3n_llama_cpp.py
TOLERANCE = 5e-4  # max |logit difference| numpy vs transformers, both fp32
MARGIN = 2e-3  # steps whose top-2 margin exceeds this must pick the same token as transformers
GEMMA3N_KINDS = {"rmsnorm_plain", "shared_kv_attention", "altup_expand", "altup_unembed", "altup_predict", "altup_correct", "laurel_residual", "gaussian_topk", "ple_project", "ple_gate", "ple_inject"}  # fmt: skip


@pytest.fixture(scope="module")
def reference():
    return json.loads((FIXTURES / "gemma3n_transformers.json").read_text())["models"]


@pytest.fixture(scope="module")
def models():
    return {name: wb.load(FIXTURES / "gemma3n" / name) for name in MODELS}


def _rows(ref_rows: dict[str, list[float]]) -> tuple[list[int], np.ndarray]:
    positions = sorted(int(k) for k in ref_rows)
    return positions, np.array([ref_rows[str(p)] for p in positions])


def _worst(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max())


# -- the fixture and the config -----------------------------------------------------------------------
def test_fixture_covers_the_gemma3n_paths(reference, models):
    assert set(reference) == {*MODELS, LLAMA_CPP_LAYOUT}
    reference = {name: reference[name] for name in MODELS}
    e2b = reference["e2b_pattern"]
    assert e2b["shared_layers"] == [10, 11, 12, 13, 14] and e2b["sparse_layers"] == [0, 1, 2, 3, 4]
    for name, ref in reference.items():
        window = models[name].config.sliding_window
        assert max(len(p["ids"]) for p in ref["prompts"].values()) > 3 * window  # crosses the window
    # the llama.cpp-layout GGUF is 5.7 MB of its own: the per-layer table llama.cpp needs 256 wide
    small = [f for f in (FIXTURES / "gemma3n").rglob("*") if f.is_file() and f.stem != LLAMA_CPP_LAYOUT]
    sizes = sum(f.stat().st_size for f in small)
    assert sizes + (FIXTURES / "gemma3n_transformers.json").stat().st_size < 2 * 2**20
    assert (FIXTURES / "gemma3n" / f"{LLAMA_CPP_LAYOUT}.gguf").stat().st_size < 6 * 2**20


def test_config_of_the_e2b_pattern(models):
    c = models["e2b_pattern"].config
    assert c.arch == "gemma3n" and c.query_pre_attn_scalar == 1.0 and c.attn_scale == 1.0
    assert [i for i in range(c.n_layers) if not c.is_sliding(i)] == [4, 9, 14]
    assert [c.kv_layer(i) for i in range(10, 15)] == [8, 8, 8, 8, 9]
    assert c.activation_sparsity == (0.95,) * 5 + (0.0,) * 10
    assert (c.altup_inputs, c.laurel_rank, c.ple_dim, c.ple_vocab_size) == (4, 4, 8, 300)
    assert c.final_logit_softcap == 30.0
    # norm weights are used as stored: no 1 + w
    w = models["e2b_pattern"].weights["blk.0.attn_norm.weight"]
    assert w.norm_offset == 0.0 and abs(float(w.dequantize().mean()) - 1.0) < 0.2


@pytest.mark.parametrize("name", MODELS)
def test_parameter_count_is_the_weights(models, name):
    m = models[name]
    assert m.config.n_params() == sum(t.n_elements for t in m.weights.values())


def test_graph_and_cache_of_shared_layers(models):
    """Layers 10-14 compute Q only and attend over the cache of layer 8 (sliding) or 9 (global); only the
    10 owning layers have a cache; the Gaussian top-k runs on layers 0-4 only."""
    model = models["e2b_pattern"]
    graph = model.graph(4, 1)
    assert set(graph.kinds()) >= GEMMA3N_KINDS  # every op kind Gemma 3n adds
    shared = {op.layer: op.attrs["kv_layer"] for op in graph.ops if op.kind == "shared_kv_attention"}
    assert shared == {10: 8, 11: 8, 12: 8, 13: 8, 14: 9}
    assert {op.layer for op in graph.ops if op.kind == "attention"} == set(range(10))
    assert not any(op.layer in shared for op in graph.ops if op.name.endswith(("attn_k", "attn_v")))
    assert {op.layer for op in graph.ops if op.kind == "gaussian_topk"} == set(range(5))
    cache = wb.Engine(model, "numpy").new_sequence().cache
    assert len(cache.owned()) == 10
    assert cache.layers[12] is cache.layers[8] and cache.layers[14] is cache.layers[9]
    assert not any(n.startswith("blk.12.attn_k") for n in model.weights)


def test_decode_cost_gathers_the_ple_table(models):
    """A decode step reads two rows of the embedding tables, never the per-layer table as a whole."""
    model = models["e2b_pattern"]
    graph = model.graph(1, 1)
    table = model.weights["per_layer_token_embd.weight"]
    cost = op_cost(graph.op("ple_embed"), graph, np.array([20]))
    assert cost.bytes_read < 2 * table.nbytes / table.shape[0]
    assert step_cost(graph, np.array([20])).flops > 0


# -- numpy against transformers -----------------------------------------------------------------------
@pytest.mark.parametrize("prompt", ["short", "long"])
@pytest.mark.parametrize("name", MODELS)
def test_prefill_logits_match_transformers(models, reference, name, prompt):
    p = reference[name]["prompts"][prompt]
    positions, want = _rows(p["prefill"])
    e = wb.Engine(models[name], "numpy")
    got = e.forward(e.new_sequence(), p["ids"], logits=positions)
    assert _worst(got, want) < TOLERANCE, f"max |logit difference| {_worst(got, want):.3g}"


@pytest.mark.parametrize("prompt", ["short", "long"])
@pytest.mark.parametrize("name", MODELS)
def test_token_by_token_logits_match_transformers(models, reference, name, prompt):
    p = reference[name]["prompts"][prompt]
    positions, want = _rows(p["token_by_token"])
    e = wb.Engine(models[name], "numpy")
    seq = e.new_sequence()
    got = np.stack([e.forward(seq, [t]) for t in p["ids"]])[positions]
    assert _worst(got, want) < TOLERANCE, f"max |logit difference| {_worst(got, want):.3g}"


@pytest.mark.parametrize("name", MODELS)
def test_chunked_prefill_matches_transformers(models, reference, name):
    """Prefill in chunks of 5 tokens: sharing layers read the owner's keys of the chunk and of the ring."""
    p = reference[name]["prompts"]["long"]
    positions, want = _rows(p["prefill"])
    e = wb.Engine(models[name], "numpy", prefill_chunk=5)
    got = e.forward(e.new_sequence(), p["ids"], logits=positions)
    assert _worst(got, want) < TOLERANCE


@pytest.mark.parametrize("name", MODELS)
def test_greedy_matches_transformers(models, reference, name):
    """Teacher-forced on transformers' greedy tokens: our argmax equals theirs wherever the margin allows."""
    p = reference[name]["prompts"]["long"]
    e = wb.Engine(models[name], "numpy")
    seq = e.new_sequence()
    ours = [int(np.argmax(e.forward(seq, p["ids"])))]
    ours += [int(np.argmax(e.forward(seq, [t]))) for t in p["greedy"][:-1]]
    checked = [(a, b) for a, b, m in zip(ours, p["greedy"], p["greedy_margins"]) if m > MARGIN]
    assert len(checked) >= len(p["greedy"]) - 2 and all(a == b for a, b in checked), checked


def _identity(b, op, env, step) -> None:
    env[op.outputs[0]] = env[op.inputs[0]]


def _no_prediction(b, op, env, step) -> None:
    x = env[op.inputs[0]]
    env[op.outputs[0]], env[op.outputs[1]] = x, np.ascontiguousarray(x[:, : x.shape[1] // 4])


@pytest.mark.parametrize(
    "kind, broken",
    [
        ("gaussian_topk", _identity),
        ("rmsnorm_plain", _identity),
        ("ple_inject", _identity),
        ("altup_predict", _no_prediction),
    ],
)
def test_each_path_changes_the_logits(models, reference, monkeypatch, kind, broken):
    """The fixture exercises each Gemma 3n path: skipping one moves the logits far beyond the tolerance."""
    p = reference["e2b_pattern"]["prompts"]["long"]
    positions, want = _rows(p["prefill"])
    monkeypatch.setitem(numpy_ref.KERNELS, kind, broken)
    e = wb.Engine(models["e2b_pattern"], "numpy")
    assert _worst(e.forward(e.new_sequence(), p["ids"], logits=positions), want) > 100 * TOLERANCE


# -- directory layouts --------------------------------------------------------------------------------
def _rewrite(
    src: str,
    dst: Path,
    rename: Callable[[str], str | None] = lambda n: n,
    add: dict[str, np.ndarray] | None = None,
    edit: dict[str, Callable[[np.ndarray], np.ndarray]] | None = None,
    config: Callable[[dict], dict] = lambda c: c,
) -> Path:
    """A copy of fixture ``src`` with tensors renamed (None: dropped), added or edited, and its config."""
    folder = FIXTURES / "gemma3n" / src
    dst.mkdir(parents=True)
    shutil.copy(folder / "tokenizer.model", dst)
    header, data = split((folder / "model.safetensors").read_bytes())
    header.pop("__metadata__", None)
    arrays = {}
    for name, e in header.items():
        lo, hi = e["data_offsets"]
        value = np.frombuffer(data[lo:hi], np.float16).reshape(e["shape"])
        value = (edit or {}).get(name, lambda v: v)(value)
        if (new := rename(name)) is not None:
            arrays[new] = value
    arrays.update(add or {})
    out, blobs, offset = {}, [], 0
    for name, value in arrays.items():
        raw = np.ascontiguousarray(value, np.float16).tobytes()
        out[name] = {"dtype": "F16", "shape": list(value.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    (dst / "model.safetensors").write_bytes(join(out, b"".join(blobs)))
    cfg = json.loads((folder / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(config(cfg)))
    return dst


def _last_logits(model, ids: list[int]) -> np.ndarray:
    e = wb.Engine(model, "numpy")
    return e.forward(e.new_sequence(), ids)


def _conditional(cfg: dict) -> dict:
    """A ``Gemma3nForConditionalGeneration`` config around the text config."""
    return {
        "architectures": ["Gemma3nForConditionalGeneration"],
        "model_type": "gemma3n",
        "text_config": cfg,
        "vision_config": {"model_type": "gemma3n_vision"},
        "audio_config": {"model_type": "gemma3n_audio"},
    }


@pytest.mark.parametrize("prefix", ["model.language_model.", "language_model.model."])
def test_conditional_generation_directories(tmp_path, models, reference, prefix):
    """Text weights under either prefix, towers beside them, unused K/V on sharing layers: same logits."""
    ignored = {
        "model.vision_tower.timm_model.conv_stem.conv.weight": np.ones((4, 3, 3, 3), np.float16),
        "model.embed_audio.embedding.weight": np.ones((8, 32), np.float16),
        "model.language_model.layers.12.self_attn.k_proj.weight": np.full((8, 32), 7.0, np.float16),
        "model.language_model.layers.12.self_attn.v_proj.weight": np.full((8, 32), 7.0, np.float16),
    }
    folder = _rewrite(
        "e2b_pattern",
        tmp_path / "cond",
        rename=lambda n: prefix + n.removeprefix("model."),
        add=ignored,
        config=_conditional,
    )
    model = wb.load(folder)
    assert model.config == models["e2b_pattern"].config.with_(name=model.config.name)
    assert set(model.weights) == set(models["e2b_pattern"].weights)
    ids = reference["e2b_pattern"]["prompts"]["long"]["ids"]
    got, want = (_last_logits(m, ids) for m in (model, models["e2b_pattern"]))
    assert np.array_equal(got, want)


# -- bad input ----------------------------------------------------------------------------------------
def test_missing_tensor_is_named(tmp_path):
    drop = "model.layers.3.altup.router_norm.weight"
    folder = _rewrite("e2b_pattern", tmp_path / "m", rename=lambda n: None if n == drop else n)
    with pytest.raises(ModelFormatError, match=r"'model\.layers\.3\.altup\.router_norm\.weight'.*missing"):
        wb.load(folder)


def test_stacked_projection_part_missing(tmp_path):
    drop = "model.altup_projections.1.weight"
    folder = _rewrite("gqa_softcap", tmp_path / "m", rename=lambda n: None if n == drop else n)
    with pytest.raises(ModelFormatError, match=r"altup_proj\.weight.*parts \[0, 2\]"):
        wb.load(folder)


@pytest.mark.parametrize("value", [3, 2, 8])
def test_altup_inputs_other_than_4(tmp_path, value):
    folder = _rewrite("gqa_softcap", tmp_path / "m", config=lambda c: {**c, "altup_num_inputs": value})
    with pytest.raises(UnsupportedModelError, match=rf"altup_num_inputs is {value}: .*4 AltUp streams"):
        wb.load(folder)


def test_ple_table_shorter_than_the_vocabulary(tmp_path):
    folder = _rewrite(
        "gqa_softcap", tmp_path / "m", config=lambda c: {**c, "vocab_size_per_layer_input": 400}
    )
    with pytest.raises(
        ModelFormatError, match=r"embed_tokens_per_layer.*300 rows.*vocab_size_per_layer_input = 400"
    ):
        wb.load(folder)


def test_token_ids_past_the_ple_table(tmp_path):
    """A table of 280 rows for a vocabulary of 300 (as E2B's 262,144 for 262,400) loads; an id past it is
    refused at the step, naming the table."""
    folder = _rewrite(
        "gqa_softcap",
        tmp_path / "m",
        edit={"model.embed_tokens_per_layer.weight": lambda v: v[:280]},
        config=lambda c: {**c, "vocab_size_per_layer_input": 280},
    )
    model = wb.load(folder)
    assert (model.config.vocab_size, model.config.ple_vocab_size) == (300, 280)
    e = wb.Engine(model, "numpy")
    assert e.forward(e.new_sequence(), [2, 279, 17]).shape == (300,)
    with pytest.raises(
        ValueError,
        match=r"token id 290 is past the per-layer embedding table per_layer_token_embd \(280 rows",
    ):
        e.forward(e.new_sequence(), [2, 290, 17])


# -- GGUF (llama.cpp's gemma3n names and metadata) ------------------------------------------------------
def _gguf(model, path: Path, drop: tuple[str, ...] = (), extra: dict[str, np.ndarray] | None = None,
          config=None) -> Path:  # fmt: skip
    """The model's weights as a GGUF file (F16, as stored in the fixture) with the metadata
    ``write_gguf`` gives Gemma 3n (those of llama.cpp's converter)."""
    tensors = {n: (GGMLType.F16, t.dequantize()) for n, t in model.weights.items() if n not in drop}
    tensors |= {n: (GGMLType.F16, v) for n, v in (extra or {}).items()}
    return write_gguf(path, config or model.config, tensors, tiny_vocab())


@pytest.mark.parametrize("name", MODELS)
def test_gguf_gives_the_same_model(tmp_path, models, reference, name):
    """Config and logits of the GGUF equal those of the Hugging Face directory (the same float16 weights);
    the unused K/V a converter may write for sharing layers are allowed and not loaded."""
    hf = models[name]
    c = hf.config
    unused = {
        f"blk.{i}.{w}.weight": np.ones(hf.weights[f"blk.{c.kv_layer(i)}.{w}.weight"].shape, np.float32)
        for i in range(c.n_layers)
        if not c.owns_kv(i)
        for w in ("attn_k", "attn_v", "attn_k_norm")
    }
    model = wb.load(_gguf(hf, tmp_path / f"{name}.gguf", extra=unused))
    ours, want = model.config.to_dict(), c.to_dict()
    for key in ("rms_eps", "activation_sparsity"):  # stored as float32 / as Phi^-1 of the sparsity
        assert ours.pop(key) == pytest.approx(want.pop(key), rel=1e-6)
    assert ours == {**want, "name": ours["name"]}
    topk = [
        [op.attrs["std_multiplier"] for op in m.graph(2, 1).ops if op.kind == "gaussian_topk"]
        for m in (model, hf)
    ]
    assert topk[0] == topk[1]  # the same Gaussian top-k multipliers
    assert set(model.weights) == set(hf.weights)
    ids = reference[name]["prompts"]["long"]["ids"]
    assert np.array_equal(_last_logits(model, ids), _last_logits(hf, ids))


def test_gguf_missing_tensor_is_named(tmp_path, models):
    path = _gguf(models["e2b_pattern"], tmp_path / "m.gguf", drop=("blk.3.altup_router_norm.weight",))
    with pytest.raises(
        ModelFormatError, match=r"Gemma 3n tensor 'blk\.3\.altup_router_norm\.weight' is missing"
    ):
        wb.load(path)


def _edited(path: Path, key: str, vtype: int | None, payload: bytes = b"") -> Path:
    out = path.with_name(f"edited-{path.name}")
    out.write_bytes(read_parts(path).with_entry(key, vtype, payload).to_bytes())
    return out


@pytest.mark.parametrize("value", [3, 5])
def test_gguf_altup_inputs_other_than_4(tmp_path, models, value):
    path = _gguf(models["gqa_softcap"], tmp_path / "m.gguf")
    edited = _edited(path, "gemma3n.altup.num_inputs", gguf_edit.U32, encode_value(gguf_edit.U32, value))
    with pytest.raises(UnsupportedModelError, match=rf"gemma3n\.altup\.num_inputs is {value}: .*4 AltUp"):
        wb.load(edited)


def test_gguf_without_shared_kv_layers(tmp_path, models):
    edited = _edited(
        _gguf(models["gqa_softcap"], tmp_path / "m.gguf"), "gemma3n.attention.shared_kv_layers", None
    )
    with pytest.raises(ModelFormatError, match=r"gemma3n\.attention\.shared_kv_layers is missing"):
        wb.load(edited)


def test_gguf_ple_table_shorter_than_the_vocabulary(tmp_path, models):
    hf = models["gqa_softcap"]
    table = hf.weights["per_layer_token_embd.weight"].dequantize()[:280]
    path = _gguf(hf, tmp_path / "m.gguf", drop=("per_layer_token_embd.weight",),
                 extra={"per_layer_token_embd.weight": table}, config=hf.config.with_(ple_vocab_size=280))  # fmt: skip
    with pytest.raises(
        ModelFormatError,
        match=r"'per_layer_token_embd\.weight' has 280 rows, fewer than the vocabulary's 300",
    ):
        wb.load(path)


def test_gguf_of_llama_cpp_converter_matches_transformers(models, reference):
    """tests/fixtures/gemma3n/e2b_pattern.gguf was written by llama.cpp's own convert_hf_to_gguf.py (the
    llama-cpp-python 0.3.36 sdist) from the e2b_pattern directory: same config, logits within tolerance."""
    model = wb.load(FIXTURES / "gemma3n" / "e2b_pattern.gguf")
    ours, want = model.config.to_dict(), models["e2b_pattern"].config.to_dict()
    for key in ("rms_eps", "activation_sparsity"):
        assert ours.pop(key) == pytest.approx(want.pop(key), rel=1e-6)
    assert ours == {**want, "name": ours["name"]}
    assert set(model.weights) == set(models["e2b_pattern"].weights)
    p = reference["e2b_pattern"]["prompts"]["long"]
    positions, want_prefill = _rows(p["prefill"])
    e = wb.Engine(model, "numpy")
    assert _worst(e.forward(e.new_sequence(), p["ids"], logits=positions), want_prefill) < TOLERANCE
    seq = e.new_sequence()
    steps = np.stack([e.forward(seq, [t]) for t in p["ids"]])
    assert _worst(steps[positions], _rows(p["token_by_token"])[1]) < TOLERANCE


class _NoGemma3n(numpy_ref.NumpyBackend):
    """A backend whose construction refuses the model's op kinds (as the cpu backend's warm-up did before it ran
    Gemma 3n)."""

    def __init__(self, model, **options):
        raise UnsupportedOpError(
            f"{type(self).__name__}: op 'ple_project' has unsupported kind 'ple_project'"
        )


def test_auto_passes_over_a_backend_without_the_kinds(monkeypatch, models, capsys):
    from workbench import backends

    monkeypatch.setattr(backends, "auto_candidates", lambda: ["cpu", "numpy"])
    real = backends.backend_class
    monkeypatch.setattr(backends, "backend_class", lambda n: _NoGemma3n if n == "cpu" else real(n))
    assert backends.make_backend("auto", models["gqa_softcap"]).name == "numpy"
    assert "cpu: _NoGemma3n: op 'ple_project' has unsupported kind" in capsys.readouterr().err


def test_ragged_batch_equals_sequences_alone(models):
    """Sequences sharing one step (decode beside prefill chunks) each read their own owners' caches."""
    from workbench.runtime.batch import SeqChunk, forward_batch

    e = wb.Engine(models["e2b_pattern"], "numpy")
    rng = np.random.default_rng(0)
    history = [rng.integers(6, 300, n).tolist() for n in (5, 1, 12, 9)]
    new = [[17], rng.integers(6, 300, 4).tolist(), [7], rng.integers(6, 300, 10).tolist()]
    seqs = [e.new_sequence(64) for _ in history]
    for s, h in zip(seqs, history, strict=True):
        e.forward(s, h)
    got = forward_batch(e, [SeqChunk(s, n, "all") for s, n in zip(seqs, new, strict=True)])
    for g, h, n in zip(got, history, new, strict=True):
        s = e.new_sequence(64)
        e.forward(s, h)
        np.testing.assert_allclose(g, e.forward(s, n, logits="all"), atol=2e-5, rtol=1e-5)


def test_rollback_of_shared_caches(models):
    """Truncating a sequence (speculative decoding's rollback) truncates each owner's cache once; decoding
    again gives the same logits."""
    e = wb.Engine(models["e2b_pattern"], "numpy")
    ids = np.random.default_rng(1).integers(6, 300, 20).tolist()
    seq = e.new_sequence(64, slack=8)
    want = e.forward(seq, ids, logits="all")
    seq.cache.truncate(14)
    got = np.stack([e.forward(seq, [t]) for t in ids[14:]])
    np.testing.assert_allclose(got, want[14:], atol=2e-5, rtol=1e-5)


# -- every config key and GGUF key bent: a clear error or a model that runs ---------------------------
JSON_VALUES = (None, True, -1, 0, 1.5, "x", [], {}, 10**30, "removed")


def _loads_cleanly(where) -> str | None:
    """None when ``where`` loads and runs 3 tokens or fails with a model error, else what went wrong."""
    try:
        model = wb.load(where)
        e = wb.Engine(model, "numpy")
        e.forward(e.new_sequence(min(64, model.config.context_length)), [2, 5, 7])
    except UnsupportedModelError:
        return None
    except Exception as ex:  # what the test looks for
        return f"{type(ex).__name__}: {str(ex)[:120]}"
    return None


def _json_paths(obj: dict, prefix: tuple = ()):
    for k, v in obj.items():
        yield (*prefix, k)
        if isinstance(v, dict):
            yield from _json_paths(v, (*prefix, k))
        elif isinstance(v, list) and v and not isinstance(v[0], (dict, list)):
            yield (*prefix, k, 0)


def test_config_fields_bent(tmp_path):
    folder = _rewrite("shared_alternating", tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    bad = []
    for path in list(_json_paths(config)):
        for value in JSON_VALUES:
            doc = json.loads(json.dumps(config))
            target = doc
            for k in path[:-1]:
                target = target[k]
            if value != "removed":
                target[path[-1]] = value
            elif isinstance(target, dict):
                target.pop(path[-1])
            (folder / "config.json").write_text(json.dumps(doc))
            if why := _loads_cleanly(folder):
                bad.append((path, value, why))
    assert not bad, bad[:5]


def test_gguf_keys_bent(tmp_path):
    parts = read_parts(FIXTURES / "gemma3n" / "e2b_pattern.gguf")
    U32, I32, F32, ARRAY = gguf_edit.U32, gguf_edit.I32, gguf_edit.F32, gguf_edit.ARRAY
    values = [
        (U32, 0), (U32, 3), (I32, -1), (F32, float("nan")), (F32, -math.inf), (gguf_edit.STRING, "x"),
        (gguf_edit.BOOL, 1), (ARRAY, (F32, [1.0, 2.0])), (ARRAY, (F32, [math.inf] * 15)),
        (ARRAY, (gguf_edit.BOOL, [0] * 15)), (ARRAY, (U32, [64] * 14 + [32])), (ARRAY, (I32, [0] * 15)),
    ]  # fmt: skip
    bad = []
    path = tmp_path / "bent.gguf"
    for entry in [e for e in parts.entries if e.key.startswith("gemma3n.")]:
        for vtype, value in [*values, (None, None)]:
            payload = b"" if vtype is None else encode_value(vtype, value)
            path.write_bytes(parts.with_entry(entry.key, vtype, payload).to_bytes())
            if why := _loads_cleanly(str(path)):
                bad.append((entry.key, vtype, value, why))
    assert not bad, bad[:5]


def test_e2b_shaped_graph_streams_the_layers_and_head_only():
    """The graph at E2B's real shapes (weights described, not loaded): a decode step streams the layers and
    the tied head, ~2.42 B parameters (the published ~2.44 B counts the unused K/V of sharing layers), and
    gathers one row of the 2.0 B-parameter per-layer table."""
    from workbench.models import gemma3n
    from workbench.models.config import ModelConfig
    from workbench.ops.graph import WeightSpec

    c = ModelConfig(
        name="e2b", arch="gemma3n", n_layers=30, hidden=2048, ffn=8192, n_heads=8, n_kv_heads=2, head_dim=256,
        vocab_size=262_400, sliding_window_pattern=5, altup_inputs=4, laurel_rank=64, ple_dim=256,
        ple_vocab_size=262_144, kv_shared_layers=10, activation_sparsity=(0.95,) * 10 + (0.0,) * 20,
        query_pre_attn_scalar=1.0, final_logit_softcap=30.0,
    )  # fmt: skip
    specs = {n: WeightSpec("BF16", s, 2 * math.prod(s)) for n, s in gemma3n.weight_shapes(c).items()}
    graph = gemma3n.build_graph(c, specs, 1, 1)
    assert [c.kv_layer(i) for i in range(20, 30)] == [18] * 4 + [19] + [18] * 4 + [19]
    streamed = {w for op in graph.ops if op.kind != "embed" for w in op.weights}
    params = sum(math.prod(specs[w].shape) for w in streamed)
    table = 262_144 * 30 * 256
    assert params == c.n_params() - table and abs(params / 1e9 - 2.422) < 0.001
    ple = op_cost(graph.op("ple_embed"), graph, np.array([100]))
    assert ple.bytes_read < 2 * 30 * 256 * 2
