PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean docs

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[torch,test,dask,export]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/confcal demo

test: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .hypothesis

# the documentation site: any Sphinx warning is an error, every gallery example runs
DOCS_STAMP := $(VENV)/.installed-docs
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[torch,test,dask,export,docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	rm -rf docs/api/generated
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html
