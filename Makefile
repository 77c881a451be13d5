# One-command set-up. `make demo` runs the worked example; `make test` runs every test.
# Both share one venv: `make demo` installs only what the demo needs (the package and the
# cli extra), `make install` everything for development (the dev extra).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: install demo test test-unit cluster-setup lint docs check-wheel bench model-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

## The package and the cli extra (rich); nothing more when the dev install is up to date.
$(VENV)/.demo-installed: pyproject.toml | $(BIN)/python
	@if [ -f $(VENV)/.installed ] && [ $(VENV)/.installed -nt pyproject.toml ]; then :; \
	else echo "$(BIN)/pip install -e '.[cli]'"; $(BIN)/pip install --quiet -e '.[cli]'; fi
	touch $@

install: $(VENV)/.installed

## The worked example on the embedded SQLite default (two real worker processes).
demo: $(VENV)/.demo-installed
	$(BIN)/consensus-lease demo
	@echo "The command is $(BIN)/consensus-lease (try: $(BIN)/consensus-lease --help)."

## Everything: unit + conformance tests on memory/SQLite, then real 3-member etcd and
## ZooKeeper clusters in containers (set up by cluster-setup when run as root).
test: install cluster-setup
	eval "$$(bash scripts/start-postgres.sh || true)"; \
	$(BIN)/python -m pytest; status=$$?; \
	bash scripts/start-postgres.sh --stop >/dev/null 2>&1 || true; \
	exit $$status

## Only what needs no containers.
test-unit: install
	$(BIN)/python -m pytest -m "not containers"

## Installs etcd/ZooKeeper/Docker from Debian packages, starts the Docker engine and
## builds the cluster images once (root only; elsewhere the container tests say why
## they cannot run — and fail under CI=true).
cluster-setup: install
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		bash docker/install-deps.sh && \
		bash docker/start-engine.sh && \
		bash docker/build-images.sh; \
	else \
		echo "cluster-setup: not root or no apt-get: container tests will report what is missing"; \
	fi

## Quick benchmark run of every backend (clusters in containers): results in ./bench-out.
bench: install cluster-setup
	$(BIN)/consensus-lease bench --quick --out bench-out

lint: install
	$(BIN)/ruff check consensus_lease tests benchmarks
	$(BIN)/mypy

## The documentation site (MkDocs + mkdocstrings) into ./site; --strict: a broken link, a
## missing reference or a docstring griffe cannot parse fails the build.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

## Build the sdist and wheel, install the wheel in a clean venv outside the checkout and
## run the demo and the unit tests against it (scripts/check-wheel.sh).
check-wheel: install
	PYTHON=$(abspath $(BIN))/python bash scripts/check-wheel.sh

## The protocol model checked deeper than CI does, then every mutation (docs/model.md).
model-check: $(VENV)/.demo-installed
	$(BIN)/consensus-lease model-check

clean:
	rm -rf site $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info build dist
