# `make demo` and `make test` are the two commands in the README; both set up first.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-quick lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/setup.sh
	bash scripts/setup.sh
	touch $(STAMP)

demo: setup
	$(VENV)/bin/onceflow demo

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest -q

# Under two minutes: everything but the Spark, cluster, Chromium, PostgreSQL, soak and wheel lanes.
QUICK := not (spark or cluster or chromium or postgres or soak or wheel)

test-quick: lint
	$(PY) -m pytest -q -m "$(QUICK)"

bench: setup
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
