"""The Grafana dashboards as data: the panel model (``model``), PromQL helpers (``promql``), one module per
dashboard (``boards``), their list (``registry``), and the Grafana JSON (``grafana``) and PNG sketch
(``sketch``) writers used by ``generate``."""
