# The two commands a newcomer needs: `make serve` and `make test`.
# Each runs `install` first; `install` is idempotent.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
ARGS ?=
# `make test` runs the suite in one process. TEST_WORKERS=2 runs the test files on two pytest-xdist
# workers instead (a file stays on one worker, --dist loadfile: many start a module-scoped server),
# each doing its math on one thread (OMP_NUM_THREADS=1; two workers with two OpenMP threads each on
# two cores were no faster than one process): 297-324 s instead of 556 s on a 2-core AMD EPYC (KVM), but
# the CPU contention makes timing-dependent tests fail more often (test_fair_share's
# test_over_max_queued_is_429 failed once in 5 such runs), so it is not the default.
TEST_WORKERS ?= 0

.PHONY: install serve test bench clean llama-server browser

$(PY):
	python3 -m venv --system-site-packages $(VENV)

# torch is installed only when none is importable (a GPU box keeps its CUDA build).
install: $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==$(TORCH_VERSION)"
	@$(PY) -m pip install -q -e ".[test]"
	@$(PY) -c "import onebit, torch, fastapi, uvicorn, openai, transformers, tokenizers, safetensors" \
		|| (echo "install incomplete: a dependency does not import" >&2; exit 1)

serve: install
	$(VENV)/bin/1bit serve $(ARGS)

# The CPU llama-server the llama-server backend tests run (tests/test_llama_server_backend.py), built once
# into the user cache (~10 min on 2 cores) and reused after. A failed build stops `make test` here.
llama-server: install
	$(VENV)/bin/1bit llama-server --build

# Headless Chromium for the web page test (tests/test_webui.py): Debian's package, installed once
# (as root, as CI runs). A failed install stops `make test` here instead of skipping the test.
browser:
	@test -x /usr/bin/chromium || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium) \
		|| (echo "could not install chromium (apt-get install chromium, as root): the web page test needs it" >&2; exit 1)

test: install llama-server browser
	$(if $(filter-out 0,$(TEST_WORKERS)),OMP_NUM_THREADS=1 )$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
