# tdiff — two commands to remember: `make demo` and `make test`.
#
# TORCH_SPEC picks the PyTorch build. The default is the CPU build that this
# machine keeps on local disk; on a GPU machine, install your CUDA torch first
# and run e.g. `make install TORCH_SPEC=` (keeps the torch already in the venv)
# or `make install TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124"`.
PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN        := $(VENV)/bin
CORPUS     ?=
DEMO_DIR   ?= demo
SHARED     ?= ../shared

.PHONY: install test demo lint bench clean-demo help

help:
	@echo "make install   create $(VENV) and install tdiff (CPU torch by default; see TORCH_SPEC)"
	@echo "make test      run the test suite"
	@echo "make demo      run the pipeline end to end on a default corpus (CORPUS=path for your own)"
	@echo "make bench     run the benchmarks in bench/ (JSON on stdout)"
	@echo "make lint      byte-compile and check the package"

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(if $(strip $(TORCH_SPEC)),$(BIN)/python -m pip install $(TORCH_SPEC))
	$(BIN)/python -m pip install -e '.[dev,onnx,plot]'
	touch $@

test: install
	$(BIN)/python -m pytest

demo: install
	DEMO_DIR=$(DEMO_DIR) CORPUS=$(CORPUS) PATH=$(CURDIR)/$(BIN):$$PATH bash examples/demo.sh

bench: install
	$(BIN)/python -m pip install -e '.[dev,bench]'
	SHARED=$(SHARED) PATH=$(CURDIR)/$(BIN):$$PATH bash bench/run_all.sh

lint: install
	$(BIN)/python -m compileall -q tdiff tests bench
	$(BIN)/python -m pyflakes tdiff tests bench

clean-demo:
	rm -rf $(DEMO_DIR)
