# inferwatch — `make help` lists the targets.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
SUDO := $(shell [ "$$(id -u)" -ne 0 ] && command -v sudo)

.PHONY: help install system-deps lint test bench demo goldens check-generated clean

help: ## show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

system-deps: ## install Debian's prometheus (promtool), prometheus-alertmanager and chromium when missing
	@missing=""; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null 2>&1 || missing="$$missing prometheus-alertmanager"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
		if command -v apt-get >/dev/null 2>&1; then \
			echo "installing Debian packages$$missing"; \
			$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends$$missing; \
		else \
			echo "warning: Debian packages$$missing missing and apt-get unavailable; tests needing them will skip (fail under CI)"; \
		fi; \
	fi

install: $(STAMP) system-deps ## Python deps into .venv, plus system packages the tests need

lint: $(STAMP) ## ruff, mypy --strict and the import contracts (layers, purity, no cycles)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: install ## run the whole test suite (real promtool; CI=1 turns skips of real components into failures)
	$(PY) -m pytest -q

bench: $(STAMP) ## benchmarks (exit non-zero when a target ratio is missed)
	$(PY) -m bench.exporter
	$(PY) -m bench.collector
	$(PY) -m bench.diagnose

demo: $(STAMP) ## the whole pipeline on simulated engines: exporters, Prometheus, Alertmanager, collector (no Docker)
	$(PY) -m inferwatch demo --duration 30

goldens: $(STAMP) ## rewrite golden files after an intended change (review the diff!)
	$(PY) -m pytest -q tests/test_goldens.py tests/test_coverage.py tests/test_dashboards.py --update-goldens
	$(PY) -m inferwatch generate alerts --slo alerts/slos.yaml --out alerts/generated
	$(PY) -m inferwatch generate dashboards --slo alerts/slos.yaml --out dashboards/generated --sketches docs/dashboards

check-generated: $(STAMP) ## fail when a committed generated file is stale
	$(PY) -m pytest -q tests/test_goldens.py tests/test_coverage.py tests/test_dashboards.py
	$(PY) -m inferwatch generate alerts --slo alerts/slos.yaml --out alerts/generated --check
	$(PY) -m inferwatch generate dashboards --slo alerts/slos.yaml --out dashboards/generated --sketches docs/dashboards --check

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
