"""Fuzzing the model loaders (issue 29: bad input never crashes).

Valid tiny models (GGUF files and Hugging Face directories) are mutated by ``loader_mutations``, in
deterministic sweeps (every region cut, every key and config field set to every type, each file removed,
each tensor entry bent) and at random (hypothesis). Each input is used as ``workbench info`` and
``generate`` use it: config and tensor index loaded, the model described, every tensor's bytes viewed,
the tokenizer summarized, then built and run on a text, then every tensor dequantized. Each input must
load or raise a clean error whose message names the input's path:

* ``UnsupportedModelError``: a well-formed model this engine does not run, or its kind
  ``ModelFormatError``: malformed files (``GGUFError``, ``SafetensorsError``, ``TokenizerDataError``);
* ``UnsupportedQuantError``: a tensor stored in a type without kernels.

Any other exception fails the test, as does a case running past ``CASE_SECONDS`` (a hang: the timer
interrupts Python code, not a stuck C call) or tracing more than ``ALLOC_FACTOR`` times the input's bytes
plus ``ALLOC_SLACK`` of Python and numpy memory while loading (dequantizing, which allocates by design,
is not counted; C++ allocations inside SentencePiece are not traced). The allocation bomb tests give the
factors meaning at scale: files of many of GGUF's smallest structures, and JSON of empty lists.

``WORKBENCH_FUZZ_EXAMPLES`` sets the random inputs per loader: 600 by default, the same on every run
(``make test``: with the sweeps, ~3,200 inputs); ``make fuzz`` sets many more, drawn anew each run.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import safetensors_edit
from gguf_edit import ARRAY, STRING, U8, Entry, GGUFParts, TensorEntry, read_parts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loader_mutations import Files, Mutated, gguf_mutations, gguf_sweep, hf_mutations, hf_sweep
from tiny import tiny_vocab, tiny_weights, write_tiny_gguf, write_tiny_hf
from tiny_variants import FUZZ, write_gguf_without_bytes, write_tokenizer_json

import workbench as wb
from workbench.cli.info import tokenizer_summary
from workbench.models.errors import UnsupportedModelError
from workbench.models.model import Model
from workbench.quant.formats import UnsupportedQuantError

EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "600"))
RANDOM = "WORKBENCH_FUZZ_EXAMPLES" in os.environ  # a chosen budget draws new inputs each run
CASE_SECONDS = float(os.environ.get("WORKBENCH_FUZZ_CASE_SECONDS", "10"))
# parsed GGUF metadata keys and tensor entries are Python objects, ~5.5x their bytes at worst; parsed
# JSON up to ~25x (see the allocation bomb tests); a valid tiny model's load allocates ~0.2 MiB besides
ALLOC_FACTOR = 8
JSON_ALLOC_FACTOR = 32
ALLOC_SLACK = 2**20
CLEAN = (UnsupportedModelError, UnsupportedQuantError)  # ModelFormatError is a kind of the first
TEXT = "Hello, wörld! <start_of_turn>user\n€ 42<end_of_turn>"


class CaseTimeout(Exception):
    """A case ran past CASE_SECONDS."""


def _alarm(_signum, _frame):
    raise CaseTimeout(f"a case ran past {CASE_SECONDS} s")


LARGEST: dict[str, int] = {"traced": 0, "size": 0}  # the largest allocation while loading, and its input


def load_as_commands_do(path: Path) -> Model:
    """What ``info`` and ``generate`` read: config and tensor index, the description, every tensor's
    bytes, the tokenizer's summary, then the tokenizer itself, run on a text."""
    model = wb.load(path)
    model.describe()
    tokenizer_summary(model)
    for t in model.weights.values():
        assert t.raw.nbytes == t.nbytes
    tok = model.tokenizer
    tok.decode(tok.encode(TEXT))
    return model


def dequantize_all(model: Model) -> str:
    """Every tensor as floats (allocates by design: not counted against the input's size)."""
    for t in model.weights.values():
        try:
            with np.errstate(all="ignore"):  # random bytes are NaNs and infinities as floats
                t.dequantize()
        except UnsupportedQuantError:  # a type with a block layout but no kernels: clean, when used
            return "loaded, a type without kernels"
    return "loaded"


def exercise(path: Path, size: int, factor: int = ALLOC_FACTOR) -> str:
    """Load the model at ``path`` (of ``size`` bytes in all): 'loaded', or the clean error's type name;
    other exceptions, hangs and allocations past ``factor`` x ``size`` (a clean error included) fail."""
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    try:
        model, outcome = None, "loaded"
        try:
            model = load_as_commands_do(path)
        except CLEAN as e:
            assert str(path) in str(e), f"the error does not name {path}: {e}"
            outcome = type(e).__name__
        peak = tracemalloc.get_traced_memory()[1] - base
        if peak > LARGEST["traced"]:
            LARGEST.update(traced=peak, size=size)
        assert peak <= factor * size + ALLOC_SLACK, f"loading traced {peak} bytes for {size} bytes of input"
        return dequantize_all(model) if model is not None else outcome
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


@pytest.fixture
def fuzz_env(monkeypatch, tmp_path) -> Iterator[Path]:
    """A throwaway tokenizer cache, the case timer's handler, and memory tracing."""
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    old = signal.signal(signal.SIGALRM, _alarm)
    tracemalloc.start()
    try:
        yield tmp_path
    finally:
        tracemalloc.stop()
        signal.signal(signal.SIGALRM, old)


Writer = Callable[[Mutated], tuple[Path, int]]  # writes a mutated model; returns its path and size


def report(what: str, outcomes: Counter[str], seconds: float) -> None:
    n = sum(outcomes.values())
    print(
        f"\n{what}: {n} inputs in {seconds:.1f} s, at most {LARGEST['traced'] / 2**10:.0f} KiB traced while "
        f"loading ({LARGEST['size'] / 2**10:.0f} KiB of input): {dict(outcomes)}"
    )


def run_random(what: str, strategy: st.SearchStrategy[Mutated], write: Writer) -> Counter[str]:
    """EXAMPLES inputs drawn by hypothesis (which shrinks a failing one); how many ended each way."""
    outcomes: Counter[str] = Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,  # the case timer guards against hangs
        derandomize=not RANDOM,
        database=None,
        print_blob=True,  # a failure of a random run prints how to reproduce it (@reproduce_failure)
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(strategy)
    def case(mutated: Mutated) -> None:
        outcomes[exercise(*write(mutated))] += 1

    LARGEST.update(traced=0, size=0)
    t0 = time.perf_counter()
    case()
    report(what, outcomes, time.perf_counter() - t0)
    assert sum(outcomes.values()) >= EXAMPLES
    return outcomes


def run_sweep(what: str, cases: list[Mutated], write: Writer) -> Counter[str]:
    """Every input of a deterministic sweep; all failures are listed together."""
    outcomes: Counter[str] = Counter()
    failures = []
    LARGEST.update(traced=0, size=0)
    t0 = time.perf_counter()
    for m in cases:
        try:
            outcomes[exercise(*write(m))] += 1
        except Exception as e:  # collected, to list every failing input at once
            failures.append(f"{m.what}: {type(e).__name__}: {e}")
    report(what, outcomes, time.perf_counter() - t0)
    assert not failures, f"{len(failures)} inputs failed:\n" + "\n".join(failures[:30])
    return outcomes


def test_the_harness_catches_hangs_and_big_allocations(fuzz_env, monkeypatch, tmp_path):
    """A load that spins past the case time, or allocates 16x its input, fails the case."""
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")

    def spin(_spec):
        while True:
            pass

    monkeypatch.setattr(sys.modules[__name__], "CASE_SECONDS", 0.2)
    monkeypatch.setattr(wb, "load", spin)
    with pytest.raises(CaseTimeout):
        exercise(path, 4)

    def hoard(_spec):  # a clean error, after a transient allocation: the peak still counts
        buf = bytearray(16 * 2**20)
        raise UnsupportedModelError(f"{path}: refused after allocating {len(buf)} bytes")

    monkeypatch.setattr(wb, "load", hoard)
    with pytest.raises(AssertionError, match="loading traced"):
        exercise(path, 2**20)


# hypothesis warns that a failing input's repr (the file's bytes) is long
quiet = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
N_VOCAB = len(tiny_vocab().tokens)


# -- GGUF ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gguf_seeds(tmp_path_factory) -> dict[str, GGUFParts]:
    root = tmp_path_factory.mktemp("gguf-seeds")
    files = {
        "tiny": write_tiny_gguf(root / "tiny.gguf", tiny_weights(FUZZ), FUZZ),
        "no-byte-pieces": write_gguf_without_bytes(root / "nobytes.gguf", config=FUZZ),
    }
    seeds = {name: read_parts(path) for name, path in files.items()}
    for name, parts in seeds.items():  # the splitter writes the seeds back byte for byte
        assert parts.to_bytes() == files[name].read_bytes()
    return seeds


def gguf_writer(folder: Path) -> Writer:
    path = folder / "case.gguf"

    def write(m: Mutated) -> tuple[Path, int]:
        blob = m.files["model.gguf"] or b""
        path.write_bytes(blob)
        return path, len(blob)

    return write


def _bomb(parts: GGUFParts, kind: str, n: int) -> GGUFParts:
    """The tiny model with ``n`` small structures added whose parsed form is largest for their bytes."""
    if kind == "keys":
        return replace(parts, entries=[*parts.entries, *(Entry(f"k{i}", U8, b"\0") for i in range(n))])
    if kind == "strings":
        payload = struct.pack("<IQ", STRING, n) + bytes(8 * n)  # n empty strings
        return parts.with_entry("junk", ARRAY, payload)
    if kind == "nested arrays":
        return parts.with_entry("junk", ARRAY, struct.pack("<IQ", ARRAY, n) + struct.pack("<IQ", U8, 0) * n)
    end = max(t.offset for t in parts.tensors) + 4096  # one-value tensors past the model's, 32 bytes apart
    extra = [TensorEntry(f"x{i}", [1], 0, end + 32 * i) for i in range(n)]
    return replace(
        parts, tensors=[*parts.tensors, *extra], data=parts.data + bytes(end + 32 * n - len(parts.data))
    )


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("keys", "loaded"),  # unknown keys are kept (info prints them)
        ("strings", "loaded"),
        ("nested arrays", "GGUFError"),  # at most 4096 arrays in arrays
        ("tensors", "ModelFormatError"),  # tensors the config has no place for
    ],
)
def test_allocation_bombs(fuzz_env, gguf_seeds, kind, expected):
    """Many of the smallest structures GGUF has, in a few MB: parsing them allocates at most
    ALLOC_FACTOR x the file (no count in the file is trusted before the bytes it needs are there)."""
    blob = _bomb(gguf_seeds["tiny"], kind, 30_000).to_bytes()
    LARGEST.update(traced=0, size=0)
    outcome = exercise(*gguf_writer(fuzz_env)(Mutated(kind, {"model.gguf": blob})))
    print(
        f"\n{kind}: {len(blob) / 2**20:.1f} MiB, at most {LARGEST['traced'] / 2**20:.1f} MiB traced: {outcome}"
    )
    assert outcome == expected


def test_gguf_sweep(fuzz_env, gguf_seeds):
    """Every region cut, every key set to every type, every tensor entry bent (on the tiny seed)."""
    cases = gguf_sweep("tiny", gguf_seeds["tiny"], N_VOCAB)
    outcomes = run_sweep("GGUF sweep", cases, gguf_writer(fuzz_env))
    assert outcomes["GGUFError"] and outcomes["ModelFormatError"] and outcomes["TokenizerDataError"]


@quiet
def test_fuzz_gguf(fuzz_env, gguf_seeds):
    strategy = st.one_of(*(gguf_mutations(n, p, N_VOCAB) for n, p in gguf_seeds.items()))
    outcomes = run_random("GGUF random", strategy, gguf_writer(fuzz_env))
    assert outcomes["loaded"] and outcomes["GGUFError"] and outcomes["ModelFormatError"]


# -- Hugging Face directories -------------------------------------------------------------------------
def _files(folder: Path) -> Files:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def hf_seeds(tmp_path_factory) -> dict[str, Files]:
    """A single-file directory with tokenizer_config.json, a sharded one, one with tokenizer.json, and
    one with a Gemma3ForConditionalGeneration config (text_config)."""
    root = tmp_path_factory.mktemp("hf-seeds")
    weights = tiny_weights(FUZZ)
    single = write_tiny_hf(root / "hf", weights, config=FUZZ)
    (single / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True}))
    sharded = write_tiny_hf(root / "sharded", weights, config=FUZZ, shards=2)
    json_tok = write_tokenizer_json(write_tiny_hf(root / "json", weights, config=FUZZ), tiny_vocab())
    conditional = write_tiny_hf(root / "conditional", weights, config=FUZZ)
    text = json.loads((conditional / "config.json").read_text())
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": text}
    (conditional / "config.json").write_text(json.dumps(cfg))
    return {p.name: _files(p) for p in (single, sharded, json_tok, conditional)}


def hf_writer(folder: Path) -> Writer:
    folder.mkdir(exist_ok=True)

    def write(m: Mutated) -> tuple[Path, int]:
        for old in folder.iterdir():
            old.unlink()
        for name, blob in m.files.items():
            if blob is not None:
                (folder / name).write_bytes(blob)
        return folder, sum(len(b) for b in m.files.values() if b is not None)

    return write


def test_hf_seeds_load(fuzz_env, hf_seeds):
    write = hf_writer(fuzz_env / "case")
    assert all(exercise(*write(Mutated(n, f))) == "loaded" for n, f in hf_seeds.items())


def _json_bomb(files: Files, kind: str) -> Files:
    """A directory whose JSON parses to the most objects for its bytes (empty lists), or a header of
    many zero-size tensors the text model ignores."""
    if kind == "config":
        cfg = json.loads(files["config.json"] or b"{}")
        junk = b'"junk": [' + b",".join([b"[]"] * 340_000) + b"]"  # just under the 1 MiB cap
        return {**files, "config.json": json.dumps(cfg).encode()[:-1] + b", " + junk + b"}"}
    if kind == "config past the cap":
        return {**files, "config.json": b" " * (2**20 + 1) + (files["config.json"] or b"")}
    header, data = safetensors_edit.split(files["model.safetensors"] or b"")
    header |= {f"vision.t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(30_000)}
    return {**files, "model.safetensors": safetensors_edit.join(header, data)}


@pytest.mark.parametrize(
    "kind, expected",
    [("config", "loaded"), ("config past the cap", "ModelFormatError"), ("header", "loaded")],
)
def test_json_allocation_bombs(fuzz_env, hf_seeds, kind, expected):
    """JSON parsed whole allocates at most JSON_ALLOC_FACTOR x the files; config.json is capped at 1 MiB."""
    write = hf_writer(fuzz_env / "case")
    LARGEST.update(traced=0, size=0)
    outcome = exercise(*write(Mutated(kind, _json_bomb(hf_seeds["hf"], kind))), factor=JSON_ALLOC_FACTOR)
    print(f"\n{kind}: {LARGEST['size'] / 2**20:.1f} MiB, at most {LARGEST['traced'] / 2**20:.1f} MiB traced")
    assert outcome == expected


def test_hf_sweep(fuzz_env, hf_seeds):
    """config.json as every JSON type, each field set to every JSON type, each file removed, each
    safetensors region cut and each header entry bent (on the single-file and conditional seeds)."""
    cases = [m for name in ("hf", "conditional") for m in hf_sweep(name, hf_seeds[name])]
    outcomes = run_sweep("HF sweep", cases, hf_writer(fuzz_env / "case"))
    assert outcomes["SafetensorsError"] and outcomes["ModelFormatError"] and outcomes["TokenizerDataError"]


@quiet
def test_fuzz_hf_dirs(fuzz_env, hf_seeds):
    strategy = st.one_of(*(hf_mutations(n, f) for n, f in hf_seeds.items()))
    outcomes = run_random("HF random", strategy, hf_writer(fuzz_env / "case"))
    assert outcomes["loaded"] and outcomes["SafetensorsError"] and outcomes["ModelFormatError"]
