# kafka-materializer developer entry points. Needs: python3 (>= 3.11), Java 17+, Maven, cargo (Rust), make.
#   make venv         create .venv and install the package with its test extras (editable)
#   make broker-jars  download the Apache Kafka broker/tool jars once (~55 MB, Maven Central)
#   make lint         ruff and mypy over the whole tree (config in pyproject.toml)
#   make test         lint, then the whole test suite (unit + real-broker integration tests)
#   make test-unit PYTHON=python3.13 VENV=.venv-3.13   the unit tests on another interpreter
#   make demo         run the end-to-end demo against a local broker

PYTHON ?= python3
VENV   ?= .venv
PYTEST_ARGS ?=

.PHONY: venv lint test test-unit demo broker-jars clean

venv: $(VENV)/.installed

# Re-install only when the project metadata changes.
$(VENV)/.installed: pyproject.toml constraints-ci.txt storage/native/Cargo.toml $(wildcard storage/native/src/*.rs storage/native/src/*/*.rs)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --disable-pip-version-check -q -U pip setuptools
	$(VENV)/bin/pip install --disable-pip-version-check -q -c constraints-ci.txt -e '.[test,spark,avro]'
	touch $@

broker-jars: venv
	$(VENV)/bin/python -m materializer.local.kafka_broker fetch

# mypy checks the import root as installed (pyproject maps storage/ and adapters/ into it):
# .typecheck/materializer links materializer/'s modules and wings, storage/ and adapters/ at their
# import paths.
lint: venv
	$(VENV)/bin/ruff check .
	rm -rf .typecheck && mkdir -p .typecheck/materializer
	ln -s ../../storage .typecheck/materializer/storage
	ln -s ../../adapters .typecheck/materializer/adapters
	for f in materializer/*.py materializer/py.typed; do ln -s ../../$$f .typecheck/materializer/; done
	for d in materializer/*/; do [ -f $$d/__init__.py ] && ln -s ../../$${d%/} .typecheck/materializer/; done; true
	$(VENV)/bin/mypy .typecheck/materializer

test-unit: venv
	$(VENV)/bin/python -m pytest tests/unit $(PYTEST_ARGS)

# pytest exits 5 when it collects no test; report that instead of failing the build.
test: lint broker-jars
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

demo: venv broker-jars
	$(VENV)/bin/materializer demo

clean:
	rm -rf $(VENV) .pytest_cache .materializer .typecheck .mypy_cache .ruff_cache
