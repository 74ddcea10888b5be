# Every target creates or reuses .venv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test lint demo bench clean

$(STAMP): pyproject.toml constraints.txt setup.py src/memfit/data/format/cwindow.c \
          src/memfit/data/sources/cresize.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,ray,parquet,tensorflow,jax]' -c constraints.txt
	touch $(STAMP)

venv: $(STAMP)

# Two test files at a time (each file's tests in one worker, so that its fixtures, such as a
# Ray cluster, are made once): 21.5 min instead of 28 on the 2-core machine, with other work.
test: $(STAMP)
	$(PY) -m ruff check src tests benchmarks examples
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -q -n 2 --dist loadfile --durations=30 tests

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks examples

demo: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) examples/demo.py

# stream.py's table, then issue 30's table of the data where users keep it (the driver runs
# its four scripts as children): about 6 minutes, then 9 here.
bench: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) benchmarks/stream.py
	$(PY) benchmarks/sources_table.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .ruff_cache
	rm -f src/memfit/data/format/cwindow*.so src/memfit/data/sources/cresize*.so
