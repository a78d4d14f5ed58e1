# Set-up and everyday commands. Each target creates .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q -c constraints.txt

.PHONY: demo test pytest lint bench wheel docs clean

# The demo's extras: torch (examples/mlp) and onnx (mlp-onnx, cnn-split and its edge call).
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(PIP) -e '.[torch,onnx]'
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) -e '.[dev]'
	touch $@

## make demo: make the examples' weights, serve them on 127.0.0.1:$FNRT_PORT (8000), invoke each, keep serving
demo: $(VENV)/.installed
	$(BIN)/python examples/demo.py

## make test: the whole test suite (in parallel, a process per core: PYTEST_WORKERS=0 runs it in one), then ruff and mypy
test: pytest lint

# Test files run whole on one worker each (--dist loadfile): a module's server fixture starts once.
PYTEST_WORKERS ?= auto
pytest: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	mkdir -p .typecheck/fnrt
	for d in client functions loader runtime tracing edge; do ln -sfn ../../$$d .typecheck/fnrt/$$d; done
	$(BIN)/mypy

# What make wheel needs, and nothing else (no torch): build and twine (also in [dev]).
$(VENV)/.installed-build:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) build twine
	touch $@

## make wheel: the sdist and the wheel in dist/, checked by twine (install: pip install dist/fnrt-*.whl)
wheel: $(VENV)/.installed-build
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*

## make docs: write the reference pages made from the code (docs/reference/)
docs: $(VENV)/.installed-dev
	$(BIN)/python docs/gen.py

## make bench: the invoke benchmark (needs wrk: apt-get install wrk)
bench: $(VENV)/.installed-dev
	$(BIN)/python bench/invoke.py

clean:
	rm -rf $(VENV) dist .fnrt .pytest_cache .mypy_cache .ruff_cache
