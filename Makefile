# The README's two commands: `make demo` and `make test`. Everything else supports them;
# `make lint` (cargo fmt, clippy, ruff check and format, mypy; the stub is checked by the tests) runs in CI after the
# tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8
export JAX_PLATFORMS ?= cpu

.PHONY: demo serve test build venv rust-test rust-test-bindings py-test lint bench clean

demo: build
	$(PY) examples/demo.py

# A serving loop: a small transformer decoding requests on 4 threads, tensor-parallel on 8
# devices, with its latency per step for a bound function, fastpjit.jit and jax.jit.
serve: build
	$(PY) examples/serve.py --devices 8

test: build rust-test rust-test-bindings py-test

venv: $(VENV)/.installed

# Every pin lives in pyproject.toml. The venv gets the build backend that it names; `build` then
# installs the package with its dependencies (jax, jaxlib and numpy, before maturin compiles)
# and the dev (tests, lints) and tools (progress bars, plots) extras.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet $$($(PY) -c 'import tomllib; \
		print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"])')
	touch $@

build: venv
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release --quiet --extras dev,tools

rust-test:
	cargo test --quiet

# The bindings' tests embed the project's interpreter, with its packages and fastpjit on the
# path; their own target folder keeps that build apart from maturin's. One thread: tests that
# first import jax at the same time can see it half-imported.
rust-test-bindings: build
	PYO3_PYTHON=$(abspath $(PY)) \
	PYTHONPATH=$$($(PY) -c 'import site; print(site.getsitepackages()[0])'):$(abspath python) \
	CARGO_TARGET_DIR=target/bindings-test cargo test --quiet -p fastpjit-bindings -- --test-threads=1

py-test:
	$(PY) -m pytest -q

lint: build
	cargo fmt --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check python tests benches examples
	$(VENV)/bin/ruff format --check python tests benches examples
	$(VENV)/bin/mypy python/fastpjit

bench: build
	$(PY) benches/run.py

clean:
	rm -rf $(VENV) target
