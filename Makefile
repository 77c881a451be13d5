# One-command set-up. `make demo` runs the worked example; `make test` runs every test.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: install demo test test-unit cluster-setup lint docs bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

## The worked example on the embedded SQLite default (two real worker processes).
demo: install
	$(BIN)/consensus-lease demo

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

clean:
	rm -rf site $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
