"""Shared fixtures: the default model and engines are loaded once per test session."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
os.environ.setdefault("WORKBENCH_CACHE", str(Path(__file__).resolve().parents[1] / ".cache" / "workbench"))
# run records written by tests go to a throwaway folder, not the checkout's experiments/
os.environ["WORKBENCH_EXPERIMENTS"] = tempfile.mkdtemp(prefix="workbench-test-experiments-")
# kernel parameters tuned on this machine by `workbench tune` must not change what the tests run
os.environ["WORKBENCH_TUNING_DB"] = str(Path(os.environ["WORKBENCH_EXPERIMENTS"]) / "tuning.json")

import workbench  # noqa: E402, F401  (before any test module imports numpy: see workbench.blas_env)


@pytest.fixture(scope="session")
def default_model():
    import workbench as wb

    return wb.load("gemma3-270m")


@pytest.fixture(scope="session")
def numpy_engine(default_model):
    import workbench as wb

    return wb.Engine(default_model, "numpy")


@pytest.fixture(scope="session")
def hf_reference():
    return json.loads((FIXTURES / "gemma3_270m_transformers.json").read_text())


@pytest.fixture(scope="session")
def llama_reference():
    return json.loads((FIXTURES / "llama_cpp_reference.json").read_text())
