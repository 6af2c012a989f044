# txmq: the two commands of the quick start are `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: install run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "txmq needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[spark,dev]'
	touch $(STAMP)

install: $(STAMP)

## Start a broker on 127.0.0.1:10911 with the embedded defaults, data in ./data.
run: $(STAMP)
	$(VENV)/bin/txmq broker

## Run the whole test suite (protocol, store, broker, client, Spark).
test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check protocol broker client spark_connector txmq tests bench
	$(VENV)/bin/mypy protocol broker/store

bench: $(STAMP)
	$(PY) bench/throughput.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
