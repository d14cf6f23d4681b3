"""Kubernetes manifests for inferwatch: the collector, the sidecars, Prometheus Operator objects, dashboards.

``inferwatch generate kubernetes`` writes them (:func:`inferwatch.kubernetes.manifests.generate`). This
package composes the alert and dashboard generators, so it sits above the components, beside
:mod:`inferwatch.stack`.
"""
