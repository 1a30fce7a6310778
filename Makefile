# Two entry points (see README): `make run` (the pipeline on the embedded default) and `make test`.
# Both create .venv on first use and reuse it afterwards; the stamp file re-installs when the
# dependency files change.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench venv clean-venv

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; set PYTHON=python3.11 (>= 3.11)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip 2>&1 | grep -v "is ignored" || true
	# CPU build of torch first (it lies on local disk); the constrained install then keeps it.
	$(BIN)/pip install --quiet torch==2.13.0 2>&1 | grep -v "is ignored" || true
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]' 2>&1 | grep -v "is ignored" || true
	$(BIN)/python -c "import torch, ray, mlflow, prefect, transformers, peft, skyrl_gym" \
		|| { echo "error: the install in $(VENV) is incomplete; delete $(VENV) and rerun"; exit 1; }
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/mazerl run

# pytest exits 5 when it collects no tests: that is a failure, not a pass.
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests"; exit 1; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python bench/env_throughput.py

clean-venv:
	rm -rf $(VENV)
