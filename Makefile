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

.PHONY: install test test-all test-latest lock demo lint bench clean-demo help

help:
	@echo "make install   create $(VENV) and install tdiff (CPU torch by default; see TORCH_SPEC)"
	@echo "make test      run the default test suite (at most 5 minutes on 2 cores)"
	@echo "make test-all  the whole suite, the tests marked slow included (what CI runs)"
	@echo "make test-latest  the smoke tests on the newest release of every dependency (scratch venv)"
	@echo "make lock      remake constraints.txt (the tested versions) from the newest releases"
	@echo "make demo      run the pipeline end to end on a default corpus (CORPUS=path for your own)"
	@echo "make bench     run the benchmarks in bench/ (JSON on stdout)"
	@echo "make lint      byte-compile and check the package"

install: $(VENV)/.installed

# The lock without its torch line: torch comes from TORCH_SPEC (a CUDA build stays as installed).
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	grep -v '^torch==' constraints.txt > $(VENV)/constraints.txt
	$(if $(strip $(TORCH_SPEC)),$(BIN)/python -m pip install $(TORCH_SPEC))
	$(BIN)/python -m pip install -c $(VENV)/constraints.txt -e '.[dev,onnx,plot]'
	touch $@

# The newest release of every dependency in a scratch venv, and the smoke tests marked `latest`
# there. torch too: LATEST_TORCH_SPEC=torch takes its newest release (on a machine without a local
# wheel that is a CUDA build of several GB); LATEST_TORCH_SPEC=torch==2.13.0 keeps the CPU build.
LATEST_VENV       ?= .venv-latest
LATEST_TORCH_SPEC ?= torch
test-latest:
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	echo '$(LATEST_TORCH_SPEC)' > $(LATEST_VENV)/torch.txt
	$(LATEST_VENV)/bin/python -m pip install -q -c $(LATEST_VENV)/torch.txt $(LATEST_TORCH_SPEC)
	$(LATEST_VENV)/bin/python -m pip install -q -c $(LATEST_VENV)/torch.txt --upgrade --upgrade-strategy eager \
	    -e '.[dev,onnx,plot]'
	$(LATEST_VENV)/bin/python -m pip freeze --all --exclude-editable | grep -v '^pip==' > $(LATEST_VENV)/versions.txt
	@echo "newest releases installed:"; grep -iE '^(torch|transformers|tokenizers|typer|click|rich|safetensors|sentencepiece|jieba|pyyaml|numpy|protobuf|sacrebleu|huggingface.hub|pytest)==' $(LATEST_VENV)/versions.txt
	$(LATEST_VENV)/bin/python -m pytest -m latest -p no:cacheprovider

# Remake constraints.txt from the newest releases, torch being TORCH_SPEC's (then `make test`).
lock: LATEST_TORCH_SPEC = $(TORCH_SPEC)
lock: test-latest
	{ sed -n '1,3p' constraints.txt; sed 's/^\(torch==[0-9.]*\)+.*/\1/' $(LATEST_VENV)/versions.txt; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

# The default suite (at most 5 minutes on 2 CPU cores); test-all adds the tests marked slow (CI runs it).
test: install
	$(BIN)/python -m pytest -m "not slow"

test-all: install
	$(BIN)/python -m pytest

demo: install
	DEMO_DIR=$(DEMO_DIR) CORPUS=$(CORPUS) PATH=$(CURDIR)/$(BIN):$$PATH bash examples/demo.sh

bench: install
	$(BIN)/python -m pip install -c $(VENV)/constraints.txt -e '.[dev,bench]'
	SHARED=$(SHARED) PATH=$(CURDIR)/$(BIN):$$PATH bash bench/run_all.sh

lint: install
	$(BIN)/python -m compileall -q tdiff tests bench
	$(BIN)/python -m pyflakes tdiff tests bench

clean-demo:
	rm -rf $(DEMO_DIR)
