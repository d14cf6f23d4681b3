"""Alert webhooks: receive Alertmanager's notifications, keep incidents, enrich and forward them.

- :mod:`~inferwatch.collector.incidents.payload`: Alertmanager's webhook payload (version 4).
- :mod:`~inferwatch.collector.incidents.intake`: store a notification: each alert once by fingerprint
  and ``startsAt``, incidents (one per episode of an Alertmanager group) and their timeline; an
  event to forward per change of state, none for a re-send.
- :mod:`~inferwatch.collector.incidents.enrich`: the diagnosis, slowest requests, runbook and dashboard
  links for an incident.
- :mod:`~inferwatch.collector.incidents.messages`: the forwarded message (JSON schema) and its Slack form.
- :mod:`~inferwatch.collector.incidents.notify`: the notify file (receivers, formats, matchers, tokens).
- :mod:`~inferwatch.collector.incidents.outbox`: events to deliveries, and deliveries to receivers with
  retries, backoff and a dead-letter state, persisted so that a restart loses none.
"""
