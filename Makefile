# make venv | test | book | lab | clean   (see README.md)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# JupyterLab refuses to run as root unless told; machines here often run as root.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: venv test book lab clean

venv: $(STAMP)

# (Re)install when the venv is missing or requirements.txt / pyproject.toml are newer.
$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -r requirements.txt
	MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE $(BIN)/python -m pip install \
		--no-build-isolation --no-deps mamba-ssm==2.3.2.post1
	$(BIN)/python -m pip install --no-deps -e .
	touch $@

test: venv
	$(BIN)/python -m pytest -q -m "not gpu"

book: venv
	rm -rf _build
	$(BIN)/jupyter-book build . -W -n --keep-going

lab: venv
	$(BIN)/jupyter lab $(LAB_ARGS)

clean:
	rm -rf _build .pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
