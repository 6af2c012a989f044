# txmq: the two commands of the quick start are `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: api-docs install compiled run test test-fast pytest lint typecheck gates bench clean docker-setup wheel wheels \
	docker-image py5-client node5-client grpc-tools grpc-gen etcd spark35 chromium promtool

## TXMQ_COMPILE=1 make install: the request path compiled with mypyc (setup.py; opt-in, see
## docs/performance.md), in place beside its .py sources.  An edit to a compiled module
## (txmq.a.b -> a/b.py) makes every module run as Python (txmq/_compiled.py) until the next
## `TXMQ_COMPILE=1 make install` compiles again.
COMPILE := $(filter 1,$(TXMQ_COMPILE))
## Whether the compiled modules in place are those of the sources (exit status 0).
COMPILED_CURRENT := $(PY) -c 'import sys, txmq._compiled as c; sys.exit(not c.decide({}).compiled)'

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "txmq needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	TXMQ_COMPILE=0 $(PY) -m pip install --quiet -e '.[broker,console,spark,dev,grpc,cluster,otel]'
	touch $(STAMP) $(RUN_STAMP)

## Compile in place with this venv's mypy (mypyc type-checks what it compiles, so it needs the
## packages and stubs the dev extra installs), unless what is there is current.
compiled: $(STAMP)
ifeq ($(COMPILE),1)
	@$(COMPILED_CURRENT) 2>/dev/null || TXMQ_COMPILE=1 $(PY) setup.py --quiet build_ext --inplace
endif

install: $(STAMP) compiled

## What `make run` needs and no more: the broker's own extra (no Spark, no test tools), so a
## first start is quick; `make test` later adds the rest to the same venv.  With TXMQ_COMPILE=1
## it needs the dev extra too (mypyc type-checks what it compiles).
RUN_STAMP := $(VENV)/.run-stamp
$(RUN_STAMP): pyproject.toml setup.py
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "txmq needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	TXMQ_COMPILE=0 $(PY) -m pip install --quiet -e '.[broker]'
	touch $(RUN_STAMP)

## Start a broker on 127.0.0.1:10911 with the embedded defaults, data in ./data.
## With TXMQ_COMPILE=1 the first start does not wait for the compiler: when the compiled
## modules are missing or older than their sources, this start runs the .py files and the
## compile goes on in the background (nice 19, log in .venv/compile.log); the next start runs
## compiled.
run: $(if $(COMPILE),$(STAMP),$(RUN_STAMP))
ifeq ($(COMPILE),1)
	@$(COMPILED_CURRENT) 2>/dev/null || { echo "txmq: compiling the request path in the" \
		"background ($(VENV)/compile.log); this start runs it as Python"; \
		nohup nice -n 19 $(MAKE) --no-print-directory compiled > $(VENV)/compile.log 2>&1 & }
endif
	$(VENV)/bin/txmq broker

## Run the lint and type gates, then the whole test suite (protocol, store, broker, client, Spark).
test: gates pytest

## With TXMQ_COMPILE=1 the suite runs on the compiled modules, and the tests comparing them
## with plain Python (tests/test_compiled.py, tests/broker/test_compiled_equal.py) run (and fail
## without a build) rather than skip.
pytest: install docker-setup py5-client node5-client etcd spark35 chromium grpc-tools promtool
	$(if $(COMPILE),TXMQ_COMPILE=1) $(PY) -m pytest

## The edit-test loop: the in-process tests (protocol, store, broker, SDK, fuzz corpus, the
## CLI's shape; no process started, no Spark, etcd, Docker or browser) on every core, no gates.
## `make test` stays the whole suite.
FAST_TIER := tests/protocol tests/core tests/broker tests/client tests/fuzz tests/test_layering.py \
	tests/test_cli_tree.py
test-fast: $(STAMP)
	$(PY) -m pytest -q -n auto -m "not slow and not external and not spark" $(FAST_TIER)

gates: lint typecheck

## The SDK's API reference (HTML, from the docstrings, with pdoc) in build/api; the test suite
## builds it too (tests/test_api_docs.py), so a docstring pdoc cannot read fails `make test`.
api-docs: $(STAMP)
	$(PY) -m txmq.apidocs build/api

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

## mypy straight from the checkout: txmq/ links the source folders (txmq/broker -> ../broker,
## ...), so the package is checked under the names it is installed as.
typecheck: $(STAMP)
	$(VENV)/bin/mypy txmq bench examples tests

## What the broker image is built from, made here since no registry may be reachable: Docker
## (Debian's docker.io, docker-compose, debootstrap; installed when missing, dockerd started
## when not running) and the base image txmq-base:bookworm.  Status 3 of the script: this
## machine cannot (not root, no apt); the Docker test then says why.
docker-setup:
	@sh tests/support/docker_base.sh || [ $$? -eq 3 ]

## txmq alone as a wheel, dist/txmq-<version>-py3-none-any.whl (TXMQ_COMPILE=1: a platform wheel
## with the request path compiled): what to `pip install` on Spark nodes or anywhere else (txmq
## is not on PyPI; see docs/spark.md).  Built in this venv, not an isolated one: mypyc
## type-checks with the dev extra's mypy and stubs.
wheel: $(STAMP)
	rm -rf dist/txmq-*.whl build/lib.* build/bdist.*
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation -w dist .

## txmq and its dependencies as wheels in build/wheels, which the image installs offline; with
## TXMQ_COMPILE=1 txmq both compiled and as plain Python, so that pip takes the compiled one
## where its platform tag fits the image's Python, the pure one elsewhere.
wheels: $(STAMP)
	rm -rf build/wheels build/lib.* build/bdist.*
	$(PY) -m pip wheel --quiet --no-build-isolation --wheel-dir build/wheels '.[broker,grpc,cluster]'
ifeq ($(COMPILE),1)
	rm -rf build/lib.* build/bdist.*  # nothing compiled goes into the pure wheel
	TXMQ_COMPILE=0 $(PY) -m pip wheel --quiet --no-deps --no-build-isolation \
		--wheel-dir build/wheels .
endif

## The broker image txmq:latest, for `docker-compose up broker`.
docker-image: docker-setup wheels etcd
	docker-compose build broker

## etcd for cluster mode and its tests: build/etcd/bin/etcd and etcdctl, Debian's etcd-server
## and etcd-client packages unpacked (no system install).
etcd:
	@sh tests/support/get_etcd.sh || [ $$? -eq 3 ]

## promtool for the tests of docs/prometheus (build/prometheus/bin/promtool), from Debian's
## prometheus package unpacked (no system install, no server).  Status 3 of the script: this
## machine cannot get it; the tests then say why.
promtool:
	@sh tests/support/get_promtool.sh || [ $$? -eq 3 ]

## Debian's chromium and chromium-driver for the web console's browser tests
## (tests/integration/test_console.py), installed with apt when missing.  Status 3 of the
## script: this machine cannot (not root, no apt); the tests then say why.
chromium:
	@sh tests/support/get_chromium.sh || [ $$? -eq 3 ]

bench: $(STAMP)
	$(PY) bench/throughput.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	rm -f txmq__mypyc.*.so txmq/_compiled_manifest.json
	find broker client protocol -name '*.so' -delete

## The official RocketMQ 5 Python client in a venv of its own (its import name `rocketmq` is
## also another PyPI package's) for tests/compat/test_grpc_python5.py.  Made once; when it
## cannot be installed the step says so and the test reports the reason (fails under CI).
PY5 := build/clients/py5
PY5_CLIENT := rocketmq-python-client==5.1.2
py5-client:
	@[ -f $(PY5)/.installed ] || { $(PYTHON) -m venv --clear $(PY5) \
		&& $(PY5)/bin/python -m pip install --quiet '$(PY5_CLIENT)' \
		&& echo '$(PY5_CLIENT)' > $(PY5)/.installed; } \
		|| echo "py5-client: $(PY5_CLIENT) could not be installed; the gRPC client tests say why"

## The official RocketMQ 5 Node.js client (npm rocketmq-client-nodejs) in build/clients/node5
## for tests/compat/test_grpc_node5.py: `npm ci` of the package.json and package-lock.json
## committed in tests/compat/node5 (the client and every dependency at the locked version).
## Made again when the committed lock changes; when it cannot be installed the step says so and
## the test reports the reason (fails under CI).
NODE5 := build/clients/node5
NODE5_LOCK := tests/compat/node5/package-lock.json
node5-client:
	@{ [ -f $(NODE5)/.installed ] && cmp -s $(NODE5_LOCK) $(NODE5)/package-lock.json; } \
		|| { rm -rf $(NODE5) && mkdir -p $(NODE5) \
		&& cp tests/compat/node5/package.json $(NODE5_LOCK) $(NODE5)/ \
		&& (cd $(NODE5) && npm ci --quiet --no-audit --no-fund --ignore-scripts) \
		&& touch $(NODE5)/.installed; } \
		|| echo "node5-client: rocketmq-client-nodejs could not be installed in $(NODE5); the gRPC client tests say why"

## pyspark 3.5 in a venv of its own, with the pandas and pyarrow it supports and txmq from this
## checkout (editable, without the spark extra, which wants pyspark >= 4), for
## tests/spark/test_spark35.py (the foreachBatch helper).  Made once, and again when
## pyproject.toml changes (txmq's own dependencies may have); when it cannot be installed the
## step says so and the test reports the reason (fails under CI).
SPARK35 := build/venvs/spark35
SPARK35_PACKAGES := 'pyspark>=3.5,<3.6' 'pandas>=2.0,<2.3' 'pyarrow>=12,<16' 'numpy<2'
spark35:
	@[ $(SPARK35)/.installed -nt pyproject.toml ] || { $(PYTHON) -m venv --clear $(SPARK35) \
		&& $(SPARK35)/bin/python -m pip install --quiet $(SPARK35_PACKAGES) \
		&& TXMQ_COMPILE=0 $(SPARK35)/bin/python -m pip install --quiet -e . \
		&& $(SPARK35)/bin/python -m pip check \
		&& echo $(SPARK35_PACKAGES) > $(SPARK35)/.installed; } \
		|| echo "spark35: pyspark 3.5 could not be installed in $(SPARK35); tests/spark/test_spark35.py says why"

## grpcio-tools in a venv of its own: the oldest release whose generated modules serve (see the
## grpc extra in pyproject.toml), which wants a protobuf older than the cluster extra's, so it
## cannot share the main venv.  tests/compat/test_grpc_codegen.py regenerates with it.
GRPC_TOOLS_VENV := build/venvs/grpc-tools
GRPC_TOOLS := grpcio-tools==1.55.3
grpc-tools:
	@{ [ -f $(GRPC_TOOLS_VENV)/.installed ] \
		&& [ "$$(cat $(GRPC_TOOLS_VENV)/.installed)" = '$(GRPC_TOOLS)' ]; } \
		|| { $(PYTHON) -m venv --clear $(GRPC_TOOLS_VENV) \
		&& $(GRPC_TOOLS_VENV)/bin/python -m pip install --quiet '$(GRPC_TOOLS)' \
		&& echo '$(GRPC_TOOLS)' > $(GRPC_TOOLS_VENV)/.installed; } \
		|| echo "grpc-tools: $(GRPC_TOOLS) could not be installed; the codegen test says why"

## Regenerate broker/grpc/vendor/v2 from broker/grpc/vendor/protos after editing a .proto file.
grpc-gen: grpc-tools
	PYTHONPATH=. $(GRPC_TOOLS_VENV)/bin/python -m txmq.broker.grpc.codegen
