"""Hypothesis strategies that mutate valid model files: GGUF files (as :class:`gguf_edit.GGUFParts`) and
Hugging Face directories (as ``{file name: bytes}``).

Each strategy draws a :class:`Mutated`: what was changed (shown when a case fails) and the files to
write. GGUF: truncation inside every region, random bytes over the header, metadata index and tensor
index, each key's value replaced by one of any type (or of its own type at the edges of its range), a
key's type id changed under its value, tensor dimensions / types / offsets / names changed, header
counts that lie. Hugging Face: config.json replaced by any JSON, each field replaced or removed
(``text_config``'s too), safetensors files truncated inside every region or their header overwritten,
header entries changed, renamed or removed, the index and tokenizer files replaced, truncated or
removed.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import safetensors_edit
from gguf_edit import (
    ARRAY,
    BOOL,
    F32,
    F64,
    I8,
    I16,
    I32,
    I64,
    STRING,
    U8,
    U16,
    U32,
    U64,
    GGUFParts,
    encode_value,
    gguf_string,
)
from hypothesis import strategies as st

from workbench.models.hf_config import TEXT_DEFAULTS
from workbench.quant.formats import GGMLType

Files = Mapping[str, bytes | None]  # file name -> content (None: the file is removed)


@dataclass(frozen=True)
class Mutated:
    """A mutated model: ``what`` says what changed; ``files`` are written (None: removed)."""

    what: str
    files: Files

    def __repr__(self) -> str:
        return f"Mutated({self.what})"


# -- values -------------------------------------------------------------------------------------------
INT_RANGES = {
    U8: (0, 2**8 - 1),
    I8: (-(2**7), 2**7 - 1),
    U16: (0, 2**16 - 1),
    I16: (-(2**15), 2**15 - 1),
    U32: (0, 2**32 - 1),
    I32: (-(2**31), 2**31 - 1),
    U64: (0, 2**64 - 1),
    I64: (-(2**63), 2**63 - 1),
}
EDGE_INTS = (
    0,
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    15,
    16,
    31,
    32,
    64,
    255,
    256,
    299,
    300,
    1024,
    2**31 - 1,
    2**31,
    2**32 - 1,
)
EDGE_INTS += (2**40, 2**63 - 1, 2**64 - 1, -1, -(2**31), -(2**63))
WORDS = ("", "gemma3", "gemma3_text", "llama", "gpt2", "linear", "yarn", "none", "<unk>", "<0x41>", "\u2581")


def ints(vtype: int) -> st.SearchStrategy[int]:
    """Integers of a GGUF integer type, its range's edges and the sizes of the tiny model often."""
    lo, hi = INT_RANGES[vtype]
    return st.one_of(st.sampled_from([v for v in EDGE_INTS if lo <= v <= hi]), st.integers(lo, hi))


def gguf_scalar(vtype: int) -> st.SearchStrategy[Any]:
    if vtype in INT_RANGES:
        return ints(vtype)
    if vtype == BOOL:  # one byte: values past 1 too
        return st.integers(0, 255)
    return st.one_of(
        st.sampled_from([0.0, -1.0, 1e-6, 8.0, 1e30]), st.floats(width=32 if vtype == F32 else 64)
    )


def gguf_text() -> st.SearchStrategy[str | bytes]:
    """Strings, bytes that need not be UTF-8, and words the loader looks for."""
    return st.one_of(st.sampled_from(WORDS), st.text(max_size=12), st.binary(max_size=12))


SCALARS = (U8, I8, U16, I16, U32, I32, F32, BOOL, U64, I64, F64)


def gguf_items(etype: int, length: int) -> st.SearchStrategy[list[Any]]:
    """``length`` array items: a few drawn values repeated (a whole vocabulary's length stays cheap)."""
    item = element(etype)
    return st.lists(item, min_size=1, max_size=4).map(lambda few: (few * (length // len(few) + 1))[:length])


def element(etype: int) -> st.SearchStrategy[Any]:
    """One array item of type ``etype`` (an array's items are arrays of scalars or strings)."""
    if etype == STRING:
        return gguf_text()
    if etype == ARRAY:
        return st.sampled_from((*SCALARS, STRING)).flatmap(
            lambda t: st.integers(0, 3).flatmap(lambda n: gguf_items(t, n).map(lambda v: (t, v)))
        )
    return gguf_scalar(etype)


def gguf_value(n_vocab: int) -> st.SearchStrategy[tuple[int, bytes]]:
    """(type id, payload) of any GGUF value: scalars, strings, arrays (nested one level) whose length is
    small or the vocabulary's give or take one, and arrays whose stored count lies."""
    scalar = st.sampled_from(SCALARS).flatmap(lambda t: gguf_scalar(t).map(lambda v: (t, encode_value(t, v))))
    string = gguf_text().map(lambda s: (STRING, gguf_string(s)))
    lengths = st.one_of(st.integers(0, 4), st.sampled_from([n_vocab - 1, n_vocab, n_vocab + 1]))
    array = st.tuples(st.sampled_from((*SCALARS, STRING, ARRAY)), lengths).flatmap(
        lambda tl: gguf_items(tl[0], tl[1]).map(lambda v: (ARRAY, encode_value(ARRAY, (tl[0], v))))
    )
    lying = st.tuples(st.sampled_from((*SCALARS, STRING)), ints(U64)).map(
        lambda tc: (ARRAY, struct.pack("<IQ", tc[0], tc[1]))
    )
    return st.one_of(scalar, string, array, lying)


# -- GGUF ---------------------------------------------------------------------------------------------
# keys the loader reads that the seed files may not hold
GGUF_EXTRA_KEYS = (
    "general.alignment",
    "gemma3.vocab_size",
    "gemma3.attention.sliding_window_pattern",
    "gemma3.rope.scaling.type",
    "gemma3.rope.scaling.factor",
    "gemma3.final_logit_softcapping",
    "tokenizer.ggml.add_space_prefix",
    "workbench.synthetic",
)


def _gguf(what: str, parts: GGUFParts) -> Mutated:
    return Mutated(what, {"model.gguf": parts.to_bytes()})


def _cut(
    what: str, blob: bytes, regions: list[tuple[str, int, int]], name: str
) -> st.SearchStrategy[Mutated]:
    """``blob`` cut at any point inside one of its regions."""
    return st.sampled_from(regions).flatmap(
        lambda r: st.integers(r[1], max(r[1], r[2] - 1)).map(
            lambda cut: Mutated(f"{what} cut at {cut} in {r[0]}", {name: blob[:cut]})
        )
    )


def _overwrite(what: str, blob: bytes, end: int, name: str) -> st.SearchStrategy[Mutated]:
    """``blob`` with one to four runs of random bytes written somewhere before ``end``."""

    def apply(runs: list[tuple[int, bytes]]) -> Mutated:
        out = bytearray(blob)
        for pos, data in runs:
            out[pos : pos + len(data)] = data
        return Mutated(f"{what} overwritten at {[p for p, _ in runs]}", {name: bytes(out)})

    run = st.tuples(st.integers(0, max(0, end - 1)), st.binary(min_size=1, max_size=8))
    return st.lists(run, min_size=1, max_size=4).map(apply)


def gguf_mutations(name: str, parts: GGUFParts, n_vocab: int) -> st.SearchStrategy[Mutated]:
    """Every kind of GGUF mutation of one seed file (and the seed itself, which must load)."""
    blob = parts.to_bytes()
    keys = sorted({e.key for e in parts.entries} | set(GGUF_EXTRA_KEYS))
    own_type = {e.key: e.vtype for e in parts.entries if e.vtype in INT_RANGES or e.vtype in (F32, F64)}
    n_t = len(parts.tensors)

    def value(key: str, typed: tuple[int, bytes] | None) -> Mutated:
        if typed is None:
            return _gguf(f"{name}: {key} removed", parts.with_entry(key, None))
        return _gguf(f"{name}: {key} = type {typed[0]} {typed[1][:24]!r}", parts.with_entry(key, *typed))

    replaced = st.sampled_from(keys).flatmap(
        lambda k: st.one_of(st.none(), gguf_value(n_vocab)).map(lambda v: value(k, v))
    )
    same_type = st.sampled_from(sorted(own_type)).flatmap(
        lambda k: gguf_scalar(own_type[k]).map(
            lambda v: value(k, (own_type[k], encode_value(own_type[k], v)))
        )
    )
    retyped = st.tuples(st.sampled_from(sorted(e.key for e in parts.entries)), ints(U32)).map(
        lambda kt: _gguf(
            f"{name}: {kt[0]} retyped {kt[1]}",
            parts.with_entry(kt[0], kt[1], next(e.payload for e in parts.entries if e.key == kt[0])),
        )
    )
    offsets = [t.offset for t in parts.tensors]
    tensor_change = st.one_of(
        st.lists(ints(U64), max_size=5).map(lambda d: {"dims": d}),
        st.sampled_from([0, 1, 2, 3, 4, 5, 2**32 - 1]).map(lambda n: {"n_dims": n}),
        st.one_of(st.sampled_from([int(t) for t in GGMLType]), ints(U32)).map(lambda t: {"type": t}),
        st.one_of(
            st.sampled_from(offsets), ints(U64), st.integers(0, len(parts.data) // 32).map(lambda i: 32 * i)
        ).map(lambda o: {"offset": o}),
        st.one_of(st.sampled_from([t.name for t in parts.tensors]), gguf_text()).map(lambda n: {"name": n}),
    )
    tensor = st.tuples(st.integers(0, n_t - 1), tensor_change).map(
        lambda ic: _gguf(f"{name}: tensor #{ic[0]} {ic[1]}", parts.with_tensor(ic[0], **ic[1]))
    )
    counts = st.tuples(
        st.one_of(st.none(), ints(U64), st.integers(n_t - 2, n_t + 2)),
        st.one_of(st.none(), ints(U64), st.integers(len(parts.entries) - 2, len(parts.entries) + 2)),
    ).map(lambda c: _gguf(f"{name}: counts {c}", replace(parts, counts=c)))
    head_end = len(parts.head())
    return st.one_of(
        st.just(Mutated(f"{name} unchanged", {"model.gguf": blob})),
        _cut(name, blob, parts.regions(), "model.gguf"),
        _overwrite(f"{name} head", blob, head_end, "model.gguf"),
        replaced,
        same_type,
        retyped,
        tensor,
        counts,
    )


# -- JSON and Hugging Face directories ----------------------------------------------------------------
# the fields the loader reads: those with transformers' defaults, and the others
CONFIG_KEYS = (
    *TEXT_DEFAULTS,
    "model_type",
    "text_config",
    "rope_scaling",
    "rope_parameters",
    "_sliding_window_pattern",
    "layer_types",
    "hidden_activation",
    "attn_logit_softcapping",
    "_name_or_path",
)
# keys of the nested objects the loaders read
NESTED_KEYS = ("rope_type", "type", "factor", "full_attention", "sliding_attention", "weight_map", "model")
JSON_WORDS = (
    "gemma3",
    "gemma3_text",
    "linear",
    "yarn",
    "default",
    "full_attention",
    "sliding_attention",
    "BPE",
)


def json_values() -> st.SearchStrategy[Any]:
    """Any JSON value, leaning to the numbers, words and keys Gemma 3 configs use."""
    leaf = st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from([0, -1, 1, 2, 3, 4, 8, 15, 16, 64, 300, 10**30, 1.5, 1e-6, -0.0, 1e308]),
        st.integers(),
        st.floats(allow_nan=False),
        st.sampled_from(JSON_WORDS),
        st.text(max_size=8),
    )
    keys = st.one_of(st.sampled_from(CONFIG_KEYS + NESTED_KEYS), st.text(max_size=6))
    return st.recursive(
        leaf,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
        max_leaves=8,
    )


JSON_VALUES = json_values()  # built once: strategies made per draw would grow hypothesis' caches


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def _json_field(
    file: str, doc: dict[str, Any], path: tuple[str, ...], files: Files
) -> st.SearchStrategy[Mutated]:
    """``doc`` (the JSON object of ``file``) with the field at ``path`` replaced by any JSON or removed."""

    def apply(new: tuple[bool, Any]) -> Mutated:
        removed, value = new
        out = json.loads(json.dumps(doc))
        target = out
        for k in path[:-1]:
            target = target[k]
        if removed:
            target.pop(path[-1], None)
        else:
            target[path[-1]] = value
        what = f"{file} {'.'.join(path)} " + ("removed" if removed else f"= {json.dumps(value)[:60]}")
        return Mutated(what, {**files, file: _dumps(out)})

    return st.tuples(st.booleans(), JSON_VALUES).map(apply)


def _field_paths(doc: dict[str, Any], extra: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Paths of a JSON object's fields, one level into nested objects, and of ``extra`` top-level keys."""
    paths = {(k,) for k in (*doc, *extra)}
    for k, v in doc.items():
        if isinstance(v, dict):
            paths |= {(k, kk) for kk in list(v)[:64]}
    return sorted(paths)


def _json_file(file: str, files: Files, extra: tuple[str, ...]) -> st.SearchStrategy[Mutated]:
    """A JSON file of the directory replaced by any JSON, or one of its fields changed."""
    whole = JSON_VALUES.map(lambda v: Mutated(f"{file} = {json.dumps(v)[:60]}", {**files, file: _dumps(v)}))
    doc = json.loads(files[file] or b"{}")
    if not isinstance(doc, dict):
        return whole
    field = st.sampled_from(_field_paths(doc, extra)).flatmap(lambda p: _json_field(file, doc, p, files))
    return st.one_of(whole, field)


def _safetensors(file: str, files: Files) -> st.SearchStrategy[Mutated]:
    """A safetensors file cut inside any region, its header overwritten, or a header entry changed."""
    blob = files[file] or b""
    header, data = safetensors_edit.split(blob)
    regions = safetensors_edit.regions(blob)
    names = sorted(n for n in header if n != "__metadata__")

    def entry(change: tuple[str, str, Any]) -> Mutated:
        name, how, value = change
        out = json.loads(json.dumps(header))
        if how == "remove":
            out.pop(name)
        elif how == "rename":
            out[str(value)] = out.pop(name)
        elif how == "replace":
            out[name] = value
        else:
            out[name][how] = value
        return Mutated(
            f"{file} entry {name} {how} {json.dumps(value)[:60]}",
            {**files, file: safetensors_edit.join(out, data)},
        )

    shapes = st.lists(
        st.one_of(st.sampled_from([0, 1, 8, 16, 32, 64, 300, 2**32, 2**63]), st.integers(-2, 2**70)),
        max_size=4,
    )
    offsets = st.lists(st.one_of(st.integers(0, len(data) + 8), st.integers()), min_size=0, max_size=3)
    change = st.one_of(
        st.tuples(
            st.sampled_from(names),
            st.just("dtype"),
            st.one_of(st.sampled_from(["F32", "F16", "BF16", "I64", "F8_E4M3"]), JSON_VALUES),
        ),
        st.tuples(st.sampled_from(names), st.just("shape"), st.one_of(shapes, JSON_VALUES)),
        st.tuples(st.sampled_from(names), st.just("data_offsets"), st.one_of(offsets, JSON_VALUES)),
        st.tuples(st.sampled_from(names), st.sampled_from(["remove", "replace"]), JSON_VALUES),
        st.tuples(
            st.sampled_from(names),
            st.just("rename"),
            st.one_of(
                st.sampled_from([*names, "language_model.model.norm.weight", "lm_head.weight"]),
                st.text(max_size=10),
            ),
        ),
    )
    return st.one_of(
        _cut(file, blob, regions, file).map(lambda m: Mutated(m.what, {**files, **m.files})),
        _overwrite(f"{file} header", blob, regions[1][2], file).map(
            lambda m: Mutated(m.what, {**files, **m.files})
        ),
        change.map(entry),
    )


def _binary_file(file: str, files: Files) -> st.SearchStrategy[Mutated]:
    """A binary file (tokenizer.model) cut anywhere, overwritten, or replaced by random bytes."""
    blob = files[file] or b""
    return st.one_of(
        st.integers(0, max(0, len(blob) - 1)).map(
            lambda c: Mutated(f"{file} cut at {c}", {**files, file: blob[:c]})
        ),
        _overwrite(file, blob, len(blob), file).map(lambda m: Mutated(m.what, {**files, **m.files})),
        st.binary(max_size=64).map(lambda b: Mutated(f"{file} = {b[:16]!r}", {**files, file: b})),
    )


def hf_mutations(name: str, files: Files) -> st.SearchStrategy[Mutated]:
    """Every kind of mutation of one Hugging Face directory (and the directory itself, which must load)."""
    present = sorted(f for f, b in files.items() if b is not None)
    kinds = [
        st.just(Mutated(f"{name} unchanged", files)),
        st.sampled_from(present).map(lambda f: Mutated(f"{name}: {f} removed", {**files, f: None})),
        _json_file("config.json", files, CONFIG_KEYS),
    ]
    for f in present:
        if f.endswith(".safetensors"):
            kinds.append(_safetensors(f, files))
        elif f.endswith(".json") and f != "config.json":
            kinds.append(_json_file(f, files, NESTED_KEYS))
        elif f == "tokenizer.model":
            kinds.append(_binary_file(f, files))
    return st.one_of(*kinds).map(
        lambda m: Mutated(f"{name}: {m.what}", m.files) if not m.what.startswith(name) else m
    )


# -- deterministic sweeps: every region, every key, every type ----------------------------------------
# one value of each GGUF type (arrays: small, of the vocabulary's length, nested, of a lying count)
def _typed_values(n_vocab: int) -> list[tuple[int, bytes]]:
    values: list[tuple[int, Any]] = [
        (U8, 0), (I8, -1), (U16, 2**16 - 1), (I16, -(2**15)), (U32, 0), (I32, -1), (U64, 2**64 - 1),
        (I64, -(2**63)), (F32, float("nan")), (F64, float("inf")), (BOOL, 2), (STRING, b"\xff\xfe"),
        (ARRAY, (U32, [0, 1])), (ARRAY, (STRING, ["a"] * n_vocab)), (ARRAY, (ARRAY, [(I8, [1])])),
    ]  # fmt: skip
    out = [(t, encode_value(t, v)) for t, v in values]
    return [*out, (ARRAY, struct.pack("<IQ", U8, 2**62))]


def gguf_sweep(name: str, parts: GGUFParts, n_vocab: int) -> list[Mutated]:
    """The file cut at the start and in the middle of every region; every key (the file's and those the
    loader reads) removed and set to a value of every type; each tensor's entry bent five ways."""
    blob, out = parts.to_bytes(), []
    for region, start, end in parts.regions():
        for cut in sorted({start, (start + end) // 2}):
            out.append(Mutated(f"{name} cut at {cut} in {region}", {"model.gguf": blob[:cut]}))
    for key in sorted({e.key for e in parts.entries} | set(GGUF_EXTRA_KEYS)):
        out.append(_gguf(f"{name}: {key} removed", parts.with_entry(key, None)))
        for vtype, payload in _typed_values(n_vocab):
            out.append(
                _gguf(f"{name}: {key} = type {vtype} {payload[:16]!r}", parts.with_entry(key, vtype, payload))
            )
    for i, t in enumerate(parts.tensors):
        for change in (
            {"dims": [0, *t.dims[1:]]},
            {"dims": [*t.dims, 2]},
            {"type": 99},
            {"offset": t.offset + 1},
        ):
            out.append(_gguf(f"{name}: tensor {t.name} {change}", parts.with_tensor(i, **change)))
        out.append(_gguf(f"{name}: tensor {t.name} offset 2**63", parts.with_tensor(i, offset=2**63)))
    return out


JSON_KINDS = (None, True, -1, 0, 1.5, "x", [], {}, 10**30)  # one value of each JSON type, and edges


def hf_sweep(name: str, files: Files) -> list[Mutated]:
    """config.json as every JSON type; each of its fields (and those the loader reads) removed and set to
    every JSON type; each file removed; each safetensors file cut at the start and in the middle of
    every region, each header entry's dtype, shape and offsets bent, the entry removed."""
    out = [
        Mutated(f"{name}: config.json = {json.dumps(v)}", {**files, "config.json": _dumps(v)})
        for v in JSON_KINDS
    ]
    out += [Mutated(f"{name}: {f} removed", {**files, f: None}) for f, b in files.items() if b is not None]
    config = json.loads(files["config.json"] or b"{}")
    for path in _field_paths(config, CONFIG_KEYS):
        for value in (*JSON_KINDS, "removed"):
            doc = json.loads(json.dumps(config))
            target = doc
            for k in path[:-1]:
                target = target[k]
            if value == "removed":
                target.pop(path[-1], None)
            else:
                target[path[-1]] = value
            out.append(
                Mutated(f"{name}: config {'.'.join(path)} = {value!r}", {**files, "config.json": _dumps(doc)})
            )
    for f, blob in files.items():
        if not f.endswith(".safetensors") or blob is None:
            continue
        header, data = safetensors_edit.split(blob)
        for region, start, end in safetensors_edit.regions(blob):
            for cut in sorted({start, (start + end) // 2}):
                out.append(Mutated(f"{name}: {f} cut at {cut} in {region}", {**files, f: blob[:cut]}))
        for entry in sorted(n for n in header if n != "__metadata__"):
            lo, hi = header[entry]["data_offsets"]
            for how, value in (
                ("dtype", "I64"),
                ("shape", []),
                ("data_offsets", [hi, lo]),
                ("removed", None),
            ):
                h = json.loads(json.dumps(header))
                if how == "removed":
                    h.pop(entry)
                else:
                    h[entry][how] = value
                out.append(
                    Mutated(
                        f"{name}: {f} {entry} {how} {value}", {**files, f: safetensors_edit.join(h, data)}
                    )
                )
    return out


__all__ = ["Files", "Mutated", "gguf_mutations", "gguf_sweep", "hf_mutations", "hf_sweep", "json_values"]
