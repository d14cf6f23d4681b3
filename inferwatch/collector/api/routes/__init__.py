"""The collector's HTTP routes, one module per concern; :func:`inferwatch.collector.api.app.create_app`
mounts them: ``traces`` (``/v1/traces``), ``health`` (``/metrics``, ``/healthz``, ``/readyz``),
``request_log`` (``/api/v1/requests``), ``statistics`` (``/api/v1/stats``), ``answers``
(``/api/v1/diagnose``, ``checklist``, ``capacity``, ``slos``) and ``webhooks`` (Alertmanager's
webhook, ``/api/v1/incidents``, the incident pages)."""
