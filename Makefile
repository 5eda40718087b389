# The README's two commands: `make demo` and `make test`. Everything else supports them;
# `make lint` (cargo fmt, clippy, ruff check and format, mypy; the stub is checked by the tests) runs in CI after the
# tests, and `make test-all` runs `make test` on every supported JAX line. `make test-fast` is the
# loop while working: the Python tests that are not marked slow and start no other process (under
# 2 minutes on 2 cores); `make test` still runs them all.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A jax and jaxlib release to install in the venv and keep there (`make test-all` sets it per
# line); empty: the newest that pyproject.toml allows for the Python. Each release has its own
# stamp in the venv, so that asking for another installs it.
JAX ?=
INSTALLED := $(VENV)/.installed$(if $(JAX),-jax-$(JAX))
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8
export JAX_PLATFORMS ?= cpu

# The JAX lines that fastpjit supports, as CPython version:jax release. Each line gets its own
# venv and its own cargo target folder, so that switching lines rebuilds nothing.
LINES ?= 3.11:0.10.2 3.12:0.11.2 3.13:0.12.0.1

.PHONY: demo serve test test-fast test-all test-cluster py-cluster-test build venv rust-test rust-test-bindings py-test lint bench clean

demo: build
	$(PY) examples/demo.py

# A serving loop: a small transformer decoding requests on 4 threads, tensor-parallel on 8
# devices, with its latency per step for a bound function, fastpjit.jit and jax.jit.
serve: build
	$(PY) examples/serve.py --devices 8

test: build rust-test rust-test-bindings py-test

venv: $(INSTALLED)

# Every pin lives in pyproject.toml. The venv gets the build backend that it names (and JAX's
# release, where one is asked for, which a constraints file keeps); `build` then installs the
# package with its dependencies (jax, jaxlib and numpy, before maturin compiles) and the dev
# (tests, lints) and tools (progress bars, plots) extras.
$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	printf '%s\n' $(if $(JAX),jax==$(JAX) jaxlib==$(JAX)) > $(VENV)/constraints.txt
	PIP_CONSTRAINT=$(abspath $(VENV))/constraints.txt $(VENV)/bin/pip install --quiet \
		$$($(PY) -c 'import tomllib; \
		print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"])') \
		$(if $(JAX),jax==$(JAX) jaxlib==$(JAX))
	touch $@

build: venv
	VIRTUAL_ENV=$(abspath $(VENV)) PIP_CONSTRAINT=$(abspath $(VENV))/constraints.txt \
		$(VENV)/bin/maturin develop --release --quiet --extras dev,tools

rust-test:
	cargo test --quiet

# The bindings' tests embed the project's interpreter (linked to its libpython, where it has a
# shared one), with its packages and fastpjit on the path; their own target folder keeps that
# build apart from maturin's. One thread: tests that first import jax at the same time can see
# it half-imported.
rust-test-bindings: build
	PYO3_PYTHON=$(abspath $(PY)) \
	LD_LIBRARY_PATH=$$($(PY) -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))') \
	PYTHONPATH=$$($(PY) -c 'import site; print(site.getsitepackages()[0])'):$(abspath python) \
	CARGO_TARGET_DIR=$${CARGO_TARGET_DIR:-target}/bindings-test \
		cargo test --quiet -p fastpjit-bindings -- --test-threads=1

# `make test` and the cluster tests on each line of LINES, each in its own .venv-<python> and
# cargo target folder (the pure-Rust core's tests, which no line changes, run once), with the
# Pythons that the machine has (pyenv's included); then which line passed, failed, or had no
# Python here, which fails too.
test-all: rust-test
	@summary=""; status=0; \
	for line in $(LINES); do \
		version=$${line%%:*}; jax=$${line#*:}; \
		if ! python=$$(.ci/python-for $$version); then \
			summary="$$summary\n  jax $$jax on CPython $$version: no python$$version here"; \
			status=1; continue; \
		fi; \
		echo "=== jax $$jax on CPython $$version ($$python)"; \
		if $(MAKE) --no-print-directory build rust-test-bindings py-test py-cluster-test \
			PYTHON=$$python VENV=.venv-$$version JAX=$$jax CARGO_TARGET_DIR=target/py$$version; \
		then \
			summary="$$summary\n  jax $$jax on CPython $$version: passed"; \
		else \
			summary="$$summary\n  jax $$jax on CPython $$version: FAILED"; status=1; \
		fi; \
	done; \
	printf "make test-all:$$summary\n"; exit $$status

# The slowest tests' times, so that a test that has grown slow shows (and gets `slow`).
py-test:
	$(PY) -m pytest -q --durations=15

# The markers are registered in pyproject.toml: `slow` (a second or more here), `subprocess`
# (starts Python processes), `multiprocess` (starts several JAX processes that join as one
# program). The property tests draw the dev profile's fewer examples (tests/conftest.py), unless
# FASTPJIT_HYPOTHESIS_PROFILE chooses another.
test-fast: build
	FASTPJIT_HYPOTHESIS_PROFILE=$${FASTPJIT_HYPOTHESIS_PROFILE:-dev} \
		$(PY) -m pytest -q -m "not slow and not subprocess and not multiprocess"

# Multi-process runs under real SLURM (a one-machine cluster on loopback) and Open MPI,
# installed from Debian's packages where missing (as root); tests/cluster/engines.py.
test-cluster: build py-cluster-test

py-cluster-test:
	FASTPJIT_CLUSTER_TESTS=1 $(PY) -m pytest -q -rP tests/cluster

lint: build
	cargo fmt --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check python tests benches examples
	$(VENV)/bin/ruff format --check python tests benches examples
	$(VENV)/bin/mypy

bench: build
	$(PY) benches/run.py

clean:
	rm -rf $(VENV) target
