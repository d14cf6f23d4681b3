"""The on-call diagnosis: which symptom, on which target, why, and what to do about it.

Signals come from Prometheus (:mod:`~inferwatch.collector.diagnosis.prometheus`: a fixed set of
fleet-wide PromQL queries, so the number of queries does not grow with the fleet) or straight
from the exporters (:mod:`~inferwatch.collector.diagnosis.exporter_scrape`: two scrapes a few seconds
apart). :mod:`~inferwatch.collector.diagnosis.evaluate` turns them into per-target statuses and
findings with the symptom catalogue of :mod:`inferwatch.core.symptoms`; it is pure, so the API,
the alert webhooks and ``inferwatch diagnose`` give the same answer.
"""
