# Every target sets itself up first: `make train` or `make test` on a fresh clone just works.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA_DIR ?= data
CHECKPOINT_DIR ?= checkpoints
BASELINE_DIR ?= checkpoints-seed
SEMI_DIR ?= checkpoints-semi
LIKELIHOOD_DIR ?= checkpoints-likelihood
ARGS ?=
CUDA ?= cuda12

# `make` alone lists the targets: each rule's `## ` comment is its line in the list.
.DEFAULT_GOAL := help
help: ## list the targets with what each does
	@echo "usage: make TARGET [ARGS='...'] [CHECKPOINT_DIR=...] [DATA_DIR=...]"
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-z][a-z-]*:[^=]*## / {printf "  %-16s %s\n", $$1, $$2}' \
		$(MAKEFILE_LIST)

.PHONY: help setup web data configs train test test-slow test-profile test-kernels kernels-emulated kernels-flags test-torch serve sample eval quality semi likelihood bench torch-cpu gpu results soak docs docs-serve docs-pictures clean

setup: $(STAMP) ## .venv with the project and its dev tools (again when pyproject.toml changes)
	@$(BIN)/python -m compileall -q -j 0 cvae service bench >/dev/null

# Reinstall only when pyproject.toml changes: a second `make setup` installs nothing. pip installs
# uv, and uv the rest: the same versions as pip resolves, and a fresh clone's set-up takes 23 s
# instead of 49 (experiments/LOG.md, 2026-11-29). uv writes the bytecode, as pip does: where
# PYTHONDONTWRITEBYTECODE is set, nothing else would, and every process would compile its imports.
# The project's own modules (an editable install, which no installer compiles) are compiled by
# `setup` itself, each time, where their source changed: 0.1 s of every process's start.
# Offline, with pip pointed at a wheelhouse (PIP_NO_INDEX, PIP_FIND_LINKS: docs/gpu.md), pip
# installs all.
INSTALL := $(if $(PIP_NO_INDEX),$(BIN)/python -m pip install --quiet,$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python)
$(STAMP): pyproject.toml service/web/package-lock.json
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(if $(PIP_NO_INDEX),,$(BIN)/python -m pip install --quiet 'uv>=0.9')
	$(INSTALL) -e '.[dev]'
	$(INSTALL) --no-deps 'jax2onnx==$(JAX2ONNX)'
	$(MAKE) --no-print-directory web
	touch $(STAMP)

# jax2onnx without its declared dependencies (pyproject.toml's `export` extra says why), pinned.
JAX2ONNX := 0.17.1

# The page's "draw in the browser" mode: onnxruntime-web, pinned in service/web/package.json
# and package-lock.json, installed from npm into service/web/node_modules (served by the
# service itself, no CDN). Without npm, or offline, the page falls back to the server and says so.
web: ## the page's onnxruntime-web files from npm (service/web; skipped without npm)
	@if command -v npm >/dev/null; then \
		npm ci --prefix service/web --no-audit --no-fund --loglevel=error || \
		echo "warning: npm ci failed (no npm registry?): the page's 'draw in the browser' mode will fall back to the server" >&2; \
	else \
		echo "warning: no npm: the page's 'draw in the browser' mode will fall back to the server" >&2; \
	fi

data: setup ## MNIST as IDX files under data/, offline
	$(BIN)/cvae data --data-dir $(DATA_DIR)

configs: setup ## the presets as TOML files in configs/, for `cvae train --config`
	$(BIN)/python -m cvae.config.toml configs

train: data ## train the default model into checkpoints/ (resumes; ARGS="--fresh" starts over)
	$(BIN)/cvae train --data-dir $(DATA_DIR) --checkpoint-dir $(CHECKPOINT_DIR) $(ARGS)

# Lint first (seconds), then the suite but its slow part (`slow`: several processes, faults,
# load, the browser, the benchmark, the model-option matrices) and the runs under other CPU kernels.
PYTEST := $(BIN)/python -m pytest -n auto --maxprocesses 8
test: setup ## ruff, then the test suite but its slow part (docs/development.md: how long)
	$(BIN)/ruff check .
	$(PYTEST) -m "not kernels and not slow" --durations=15 $(ARGS)

test-slow: setup ## the suite's slow part: processes, faults, load, browser, model matrices
	$(PYTEST) -m "slow and not kernels" --durations=15 $(ARGS)

# Each test's CPU-seconds (subprocesses included), the costliest first: what to make cheaper
# when the suite outgrows its budget. CPU time, unlike wall time, holds on a busy machine.
PROFILE := .test-cpu-profile.tsv
test-profile: setup ## the suite's CPU-seconds per test, costliest first, into .test-cpu-profile.tsv
	rm -f $(PROFILE)
	CVAE_CPU_PROFILE=$(CURDIR)/$(PROFILE) $(PYTEST) -m "not kernels" -q $(ARGS) || true
	sort -rn $(PROFILE) -o $(PROFILE) && head -40 $(PROFILE) && awk '{s += $$1} END {print s, "CPU-seconds in all"}' $(PROFILE)

# The bit-identity claims under other CPU kernels than this machine's (tests/test_bit_identity.py
# says what varies them), in two parts run side by side: `kernels-emulated`, the sampler's claims
# in subprocesses (valgrind, Debian's package, installed here if missing, emulates a CPU with AVX2
# and no AVX-512; alone it runs on one core for 6 to 7 minutes, so the other part fills the
# second), and `kernels-flags`, every test marked `determinism` (resume, process counts, the
# sampler) again under the production flags (none: `make test` compiles with LLVM's passes off,
# tests/conftest.py says why) and under each XLA flag in KERNEL_FLAGS. An XLA_FLAGS that is set,
# even empty, is kept by tests/conftest.py. Each part's output is printed when it ends.
KERNEL_FLAGS := --xla_cpu_max_isa=SSE4_2 --xla_cpu_experimental_ynn_fusion_type=
test-kernels: setup ## the bit-identity claims again under other CPU kernels (valgrind, XLA flags)
	$(MAKE) --no-print-directory -j2 --output-sync=target kernels-emulated kernels-flags

kernels-emulated: setup ## test-kernels' first part: the sampler's claims under valgrind, XLA flags
	command -v valgrind >/dev/null || (apt-get install -y -qq valgrind || (apt-get update -qq && apt-get install -y -qq valgrind))
	XLA_FLAGS= $(BIN)/python -m pytest -m kernels $(ARGS)

kernels-flags: setup ## test-kernels' second part: the determinism tests under each XLA flag
	for flag in "" $(KERNEL_FLAGS); do \
		XLA_FLAGS=$$flag $(BIN)/python -m pytest -m "determinism and not kernels" -n auto $(ARGS) || exit 1; \
	done

# The `torch` extra (torchvision's datasets) in a venv of its own, so the main one keeps the CPU
# torch of `make torch-cpu` for the benchmark; then the tests that need the real torchvision.
# About 6.3 GB installed (torch 2.14.1 is a CUDA build); .ci/run calls this after `make test`.
TORCH_VENV := .venv-torch
test-torch: $(TORCH_VENV)/.installed ## the real-torchvision tests, in their own .venv-torch (about 6 GB)
	$(TORCH_VENV)/bin/python -c "import torch, torchvision"  # a broken extra fails, not skips
	$(TORCH_VENV)/bin/python -m pytest tests/test_data.py -k torchvision $(ARGS)

$(TORCH_VENV)/.installed: pyproject.toml
	test -x $(TORCH_VENV)/bin/python || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(TORCH_VENV)/bin/python -m pip install --quiet -e '.[torch,dev]'
	touch $@

serve: setup ## the service on http://127.0.0.1:8000/ (the page, /sample, /transfer, /docs...)
	$(BIN)/cvae serve --checkpoint-dir $(CHECKPOINT_DIR) $(ARGS)

sample: setup ## a PNG grid from the latest checkpoint -> checkpoints/sample.png
	$(BIN)/cvae sample --checkpoint-dir $(CHECKPOINT_DIR) --out $(CHECKPOINT_DIR)/sample.png $(ARGS)

eval: data ## test-set metrics of the latest checkpoint -> checkpoints/eval.json
	$(BIN)/cvae eval --checkpoint-dir $(CHECKPOINT_DIR) --data-dir $(DATA_DIR) --json $(CHECKPOINT_DIR)/eval.json $(ARGS)

# The quality targets: the default run scored beside the baseline setup (`--preset seed`, 10 epochs),
# both trained first if needed (a finished run has nothing left to do), in one `cvae eval`.
quality: train ## eval beside the baseline (`--preset seed`, 10 epochs; trains either if needed)
	$(BIN)/cvae train --preset seed --data-dir $(DATA_DIR) --checkpoint-dir $(BASELINE_DIR) --no-progress
	$(BIN)/cvae eval --checkpoint-dir $(CHECKPOINT_DIR) --data-dir $(DATA_DIR) --baseline-dir $(BASELINE_DIR) --json $(CHECKPOINT_DIR)/eval.json $(ARGS)

# Few labels (docs/semi-supervised.md): 100 labelled digits and the rest without their labels
# (`--preset semi`), trained if needed, then evaluated: q(y|x)'s test error and the rest.
semi: data ## train with only 100 labels (`--preset semi`) into checkpoints-semi/, then eval
	$(BIN)/cvae train --preset semi --data-dir $(DATA_DIR) --checkpoint-dir $(SEMI_DIR) --no-progress
	$(BIN)/cvae eval --checkpoint-dir $(SEMI_DIR) --data-dir $(DATA_DIR) --json $(SEMI_DIR)/eval.json $(ARGS)

# The likelihood budget (docs/model.md): 640 epochs of the ELBO (`--preset likelihood`), then 20
# of the DReG bound from those weights (`--preset likelihood-dreg`), each resumed if stopped;
# then the published protocol's bounds (K = 5000 on all 10,000 test digits, about 7 minutes).
likelihood: data ## the likelihood preset, 2 stages (30 min) -> checkpoints-likelihood-dreg/, eval
	$(BIN)/cvae train --preset likelihood --data-dir $(DATA_DIR) --checkpoint-dir $(LIKELIHOOD_DIR) --no-progress
	$(BIN)/cvae train --preset likelihood-dreg --init-from $(LIKELIHOOD_DIR) --data-dir $(DATA_DIR) --checkpoint-dir $(LIKELIHOOD_DIR)-dreg --no-progress
	$(BIN)/cvae eval --checkpoint-dir $(LIKELIHOOD_DIR)-dreg --data-dir $(DATA_DIR) --iwae-k 5000 --iwae-k-marginal 10 --json $(LIKELIHOOD_DIR)-dreg/eval.json $(ARGS)

# One table of the Results page rerun: each seed's commands (docs/results_page.py's GROUPS), then
# its eval JSON into docs/results/ (docs/results_run.py). SEEDS="1" reruns one seed.
results: data ## rerun a table of the Results page (TABLE=NAME, SEEDS="0 1 2") into docs/results/
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python docs/results_run.py $(TABLE) --seeds "$(SEEDS)"

# The service benchmark drives the server with wrk (Debian's package), installed here if missing.
bench: data ## the speed benchmarks -> BENCHMARKS.md
	command -v wrk >/dev/null || (apt-get install -y -qq wrk || (apt-get update -qq && apt-get install -y -qq wrk))
	$(BIN)/python -m bench.run $(ARGS)

# PyTorch for the benchmark's baseline (b) only: torch's CPU build, no torchvision (the `torch`
# extra is for torchvision's datasets). pip takes it from a local wheel where the machine has
# one (ours does); elsewhere it may download a CUDA build of several GB.
torch-cpu: setup ## PyTorch's CPU build into .venv, for the benchmark's PyTorch baseline
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet torch==2.13.0

# GPU: JAX's CUDA wheels into .venv (extra `cuda12`; `make gpu CUDA=cuda13` for CUDA 13
# drivers). Nothing else changes: `make gpu train` trains on every local GPU, `cvae launch`
# runs one process per GPU.
gpu: setup ## JAX's CUDA wheels into .venv (CUDA=cuda13 for CUDA 13 drivers)
	$(BIN)/python -m pip install --quiet -e '.[dev,$(CUDA)]'
	$(BIN)/python -c "import jax; print('JAX backend:', jax.default_backend(), jax.devices())"

# The service's soak, churn and fuzz tests, run longer than in `make test`.
soak: setup ## the service under a long load, checkpoint churn and fuzzing
	CVAE_SOAK_SECONDS=60 CVAE_CHURN_SECONDS=20 CVAE_FUZZ_EXAMPLES=200 \
		$(BIN)/python -m pytest -s tests/test_service_soak.py tests/test_service_fuzz.py $(ARGS)

# The documentation site (mkdocs.yml): the `docs` extra into .venv once (its own stamp, so the
# main install stays lean), then a strict build into site/: a broken link, anchor or API
# reference fails it. `make docs-serve` previews it with live reload. Material for MkDocs prints a
# boxed notice at each build that it reaches end of life on 2027-05-05 (its team's Zensical
# succeeds it): a notice, not a build warning, so --strict passes; NO_MKDOCS_2_WARNING silences
# MkDocs' own notice about MkDocs 2.
DOCS_STAMP := $(VENV)/.installed-docs
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs
docs: $(DOCS_STAMP) ## the documentation site into site/ (strict: a broken link fails)
	$(MKDOCS) build --strict

docs-serve: $(DOCS_STAMP) ## preview the documentation site on http://127.0.0.1:8001/ with live reload
	$(MKDOCS) serve --dev-addr 127.0.0.1:8001

$(DOCS_STAMP): $(STAMP)
	$(INSTALL) -e '.[dev,docs]'
	touch $@

# The site's pictures (docs/images/), drawn from a trained checkpoint by docs/render_pictures.py:
# `make train docs-pictures`, or CHECKPOINT_DIR=... for another run.
docs-pictures: data ## redraw the site's pictures (docs/images/) from a trained checkpoint
	$(BIN)/python docs/render_pictures.py --checkpoint-dir $(CHECKPOINT_DIR) --data-dir $(DATA_DIR) --out-dir docs/images

clean: ## remove .venv, .venv-torch, site/, service/web/node_modules and build files
	rm -rf $(VENV) $(TORCH_VENV) build site *.egg-info service/web/node_modules
