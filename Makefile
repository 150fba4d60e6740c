# Two commands do all the setup on a fresh machine:  make demo  /  make test
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
# torch: the CPU build (the plain name pulls a multi-GB CUDA build).
TORCH  ?= torch==2.13.0

.PHONY: setup demo demo-capsule test lint unit crossvenvs crossarch bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q '$(TORCH)' || echo "warning: $(TORCH) could not be installed; torch tests will skip"
	touch $@

setup: $(VENV)/.installed

# Interpreters for the cross-version tests (pyenv's 3.12 and 3.13 when present). A pyenv
# shim is on PATH even for versions that are not selected, so each candidate must run.
crossvenvs: setup
	@for v in 3.11 3.12 3.13; do \
	  py=""; \
	  for c in $$(command -v python$$v) $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.*/bin/python$$v 2>/dev/null); do \
	    if $$c -c "" 2>/dev/null; then py=$$c; break; fi; \
	  done; \
	  if [ -n "$$py" ] && [ ! -x .venv$$v/bin/python ]; then \
	    $$py -m venv .venv$$v && .venv$$v/bin/pip install -q -e . numpy pandas scikit-learn scipy pytest psutil || rm -rf .venv$$v; \
	  fi; \
	done; true

demo: setup crossvenvs
	$(PY) examples/demo.py

demo-capsule: setup
	$(PY) examples/demo_capsule.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# The inner loop: everything but the slow parts (tests/conftest.py SLOW_PARTS, @pytest.mark.slow).
unit: setup
	$(PY) -m pytest -q -x -m "not slow"

test: setup crossvenvs lint
	$(PY) -m pytest -q

# Capsules and paused programs moved to s390x (big-endian) and back under qemu-user: the
# rootfs is built once per machine into ~/.cache/sojourn/rootfs (10-20 min); arm64 too
# with ARCHES="s390x arm64". Needs root (debootstrap, chroot). `make test` runs these
# tests as well when a rootfs is there (CI builds s390x's in the background).
ARCHES ?= s390x
crossarch: setup
	for a in $(ARCHES); do tools/foreign-rootfs $$a || exit 1; done
	SOJOURN_REQUIRE_CROSSARCH=$$(echo $(ARCHES) | tr ' ' ,) $(PY) -m pytest -q tests/crossarch

bench: setup
	$(PY) bench/bench_capsule.py

clean:
	rm -rf $(VENV) .venv3.* .pytest_cache .mypy_cache
