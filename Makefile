# `make demo` and `make test` are the two commands in the README; both set up first.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup bytecode demo test test-quick lint bench fuzz soak clean

# `make fuzz FUZZ_SECONDS=60` for a short run.
FUZZ_SECONDS ?= 1800
# `make soak SOAK_SECONDS=600` for a longer one.
SOAK_SECONDS ?= 150

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/setup.sh
	bash scripts/setup.sh
	touch $(STAMP)

# Where PYTHONDONTWRITEBYTECODE is set (as on our CI machines), each of the many Python processes
# that the demo, the tests and the benchmarks start would compile the sources it imports again:
# about 0.25 s of CPU per process, a sixth of the suite's CPU.
bytecode: setup
	$(PY) -m compileall -q -j 0 src tests benchmarks

demo: setup bytecode
	$(VENV)/bin/onceflow demo

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Four workers: the Spark tests in turn on one (tests/conftest.py), the other files on the others.
# Most tests wait on clients, timers and fsyncs: with three the two cores were three quarters busy.
test: lint bytecode
	$(PY) -m pytest -q -n 4 --durations=25

# Under two minutes: everything but the Spark, cluster, Chromium, PostgreSQL, ZooKeeper, soak and wheel lanes.
QUICK := not (spark or cluster or chromium or postgres or zookeeper or soak or wheel)

test-quick: lint bytecode
	$(PY) -m pytest -q -n 3 -m "$(QUICK)"

bench: setup bytecode
	$(PY) benchmarks/run.py

# The soaks at full length (make test runs them for 15 to 60 s): the disk filling and the
# descriptors running out under producers, transactions and read_committed readers; brokers,
# coordinators included, SIGKILLed and started again under an exactly-once pipeline and acks=all
# producers.
soak: setup bytecode
	ONCEFLOW_SOAK_SECONDS=$(SOAK_SECONDS) ONCEFLOW_COORDINATOR_SOAK_S=$(SOAK_SECONDS) \
	ONCEFLOW_SOAK_S=$(SOAK_SECONDS) $(PY) -m pytest -q -s --timeout 3600 tests/broker/test_disk_fault_soak.py \
		tests/cluster_mode/test_coordinator_soak.py tests/cluster_mode/test_failover_under_load.py

fuzz: setup
	$(VENV)/bin/onceflow fuzz --seconds $(FUZZ_SECONDS) --regressions tests/fuzz/regressions \
		--json benchmarks/results/fuzz-latest.json

clean:
	rm -rf $(VENV) .venv-quixstreams .mypy_cache .pytest_cache .ruff_cache
