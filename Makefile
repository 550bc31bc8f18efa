# kafka-materializer developer entry points. Needs: python3 (>= 3.11), Java 17+, Maven, cargo (Rust), make.
#   make venv         create .venv: the package (editable) with its extras testing, spark, avro, metrics, serve,
#                     and the dev dependency group (pyproject [dependency-groups]: test tools, ruff, mypy),
#                     at the versions constraints-ci.txt pins
#   make broker-jars  download the Apache Kafka broker/tool jars once (~55 MB, Maven Central)
#   make lint         ruff and mypy over the whole tree (config in pyproject.toml)
#   make test         lint, then the whole test suite (unit + real-broker integration tests; two
#                     pytest-xdist workers, PYTEST_WORKERS=0 for one process)
#   make test-unit PYTHON=python3.13 VENV=.venv-3.13   the unit tests on another interpreter
#   make demo         run the end-to-end demo against a local broker
#   make dist         dist/: the sdist, and ONE wheel for CPython 3.11+ built from that sdist alone
#                     (cp311-abi3-manylinux_2_XX_<arch>: auditwheel repair gives the manylinux tag);
#                     build tools in .venv-dist (dependency group `dist`); .ci/check_dist.py checks both

PYTHON ?= python3
VENV   ?= .venv
DIST_VENV ?= .venv-dist
PYTEST_ARGS ?=
PYTEST_WORKERS ?= 2

.PHONY: venv lint test test-unit test-native demo broker-jars dist clean

venv: $(VENV)/.installed

# Re-install only when the project metadata changes.
# pip >= 25.1 installs PEP 735 dependency groups (--group).
$(VENV)/.installed: pyproject.toml setup.cfg constraints-ci.txt storage/native/Cargo.toml $(wildcard storage/native/src/*.rs storage/native/src/*/*.rs)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --disable-pip-version-check -q -U 'pip>=25.1' setuptools
	$(VENV)/bin/pip install --disable-pip-version-check -q -c constraints-ci.txt -e '.[testing,spark,avro,metrics,serve]' \
		--group dev
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

# The native core's own Rust tests (lz4 frames, the MD5 lanes), in the release mode it is built in.
test-native:
	cd storage/native && cargo test --release --quiet

# Two pytest-xdist workers: the tests that share the session's broker (tests/integration, tests/docs)
# run one after another in one, the unit tests beside them in the other (tests/conftest.py).
# PYTEST_WORKERS=0 runs everything in one process.
# pytest exits 5 when it collects no test; report that instead of failing the build.
test: lint test-native broker-jars
	$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

demo: venv broker-jars
	$(VENV)/bin/materializer demo

$(DIST_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/pip install --disable-pip-version-check -q -U 'pip>=25.1'
	$(DIST_VENV)/bin/pip install --disable-pip-version-check -q --group dist
	touch $@

# `python -m build` with no --sdist/--wheel builds the sdist, then the wheel from the unpacked sdist
# (so an incomplete sdist fails here), each in an isolated environment with the build-system
# requirements. auditwheel repair (patchelf on PATH) retags linux_<arch> as the most compatible
# manylinux_2_XX the .so's glibc symbol versions allow; it vendors nothing (libc and libgcc_s only).
dist: $(DIST_VENV)/.installed
	rm -rf dist build/dist-unrepaired
	$(DIST_VENV)/bin/python -m build --outdir build/dist-unrepaired .
	mkdir -p dist && cp build/dist-unrepaired/*.tar.gz dist/
	PATH="$(CURDIR)/$(DIST_VENV)/bin:$$PATH" $(DIST_VENV)/bin/auditwheel repair --wheel-dir dist \
		build/dist-unrepaired/*.whl
	$(DIST_VENV)/bin/python .ci/check_dist.py dist

clean:
	rm -rf $(VENV) $(DIST_VENV) dist build .pytest_cache .materializer .typecheck .mypy_cache .ruff_cache
