"""The collector on Kubernetes: a stateless Deployment in front of PostgreSQL, its Service, the
migration Job, a PodDisruptionBudget, a HorizontalPodAutoscaler and a NetworkPolicy.

**Stateless.** Every replica writes the same PostgreSQL database (the URL and the tokens come from
the Secret :data:`~inferwatch.kubernetes.kube_objects.SECRET`); the rollups, incident intake and
migrations serialise on PostgreSQL advisory locks, so replicas need no coordination. The spool (what
the database refused while it was down, ``$INFERWATCH_DATA_DIR/collector``) lives in an ``emptyDir``:
it survives a container restart, not the pod's deletion.

**Migrations.** The Job ``inferwatch-db-upgrade-<hash of the image>`` runs ``inferwatch db upgrade``
once per image (a Job's pod template cannot change, so a new image is a new Job). The Deployment
waits for it with an init container that runs the same idempotent ``db upgrade``, not one that
watches the Job: ``db upgrade`` takes the advisory lock the Job holds while it migrates, so the
init container waits for a running Job, returns at once when the schema is at the head, and
migrates itself when the Job has not run (``kubectl apply`` order, a deleted Job). Watching the Job
would need a ServiceAccount allowed to read Jobs, a kubectl image and a Job name the pods know.
"""

from __future__ import annotations

from typing import Any, Final

from inferwatch.core import topology
from inferwatch.kubernetes.kube_objects import (
    COLLECTOR,
    ENGINE_LABEL,
    NAME_LABEL,
    ONCALL_LABEL,
    PROXY_LABEL,
    READERS,
    SECRET,
    SECRET_DATABASE_URL,
    SECRET_INGEST_TOKEN,
    SECRET_READ_TOKEN,
    KubeOptions,
    collector_labels,
    container_security_context,
    dump,
    http_probe,
    metadata,
    pod_security_context,
    resources,
    secret_env,
    short_hash,
)

REPLICAS: Final = 2
MAX_REPLICAS: Final = 6
CPU_TARGET_PERCENT: Final = 70
SPOOL_LIMIT: Final = "2Gi"
"""the ``emptyDir`` of the data directory: the spool's 1 GiB cap (``spool_max_bytes``) and its segments."""

SIZING: Final = """\
Resources, from docs/collector.md and docs/reliability.md:
- CPU: about 35 us per span on PostgreSQL (7 us in the collector's process, 26-29 us in its decode
  workers; docs/collector.md, "Ingest"): 1,000 spans/s take 0.04 cores, 33,000 spans/s fill 2 cores.
  Requested 500m, limited to 2; the HorizontalPodAutoscaler adds replicas at 70 % of the request.
- Memory: 112 MiB RSS at 1,000 spans/s (make soak, docs/reliability.md); bodies being received are
  bounded by max_uploads x max_body_bytes, 256 x 4 MiB = 1 GiB (docs/collector.md, "Limits and
  validation"). Requested 256Mi, limited to 1536Mi (the 1 GiB, the resident set, headroom).
The Secret inferwatch-collector is yours to create (keys database-url, ingest-token, read-token):
  kubectl create secret generic inferwatch-collector --from-literal=database-url=postgresql+psycopg://... \\
    --from-literal=ingest-token=$(openssl rand -hex 32) --from-literal=read-token=$(openssl rand -hex 32)"""


def _token_env() -> list[dict[str, Any]]:
    """The tokens from the Secret, handed to the collector as the JSON lists its settings read."""
    return [
        secret_env("INFERWATCH_INGEST_TOKEN", SECRET_INGEST_TOKEN),
        secret_env("INFERWATCH_READ_TOKEN", SECRET_READ_TOKEN),
        {"name": "INFERWATCH_COLLECTOR_INGEST_TOKENS", "value": '["$(INFERWATCH_INGEST_TOKEN)"]'},
        {"name": "INFERWATCH_COLLECTOR_READ_TOKENS", "value": '["$(INFERWATCH_READ_TOKEN)"]'},
    ]


def _base_env() -> list[dict[str, Any]]:
    return [
        {"name": topology.DATA_DIR_ENV, "value": topology.CONTAINER_DATA_DIR},
        secret_env("INFERWATCH_COLLECTOR_DATABASE_URL", SECRET_DATABASE_URL),
    ]


def _mounts() -> list[dict[str, Any]]:
    return [{"name": "data", "mountPath": topology.CONTAINER_DATA_DIR}, {"name": "tmp", "mountPath": "/tmp"}]


def _volumes() -> list[dict[str, Any]]:
    return [
        {"name": "data", "emptyDir": {"sizeLimit": SPOOL_LIMIT}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
    ]


def migration_container(options: KubeOptions, name: str) -> dict[str, Any]:
    """``inferwatch db upgrade`` against the Secret's database (the Job's container and the init container)."""
    return {
        "name": name,
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "args": topology.migration_args(),
        "env": _base_env(),
        "resources": resources(("100m", "1"), ("128Mi", "512Mi")),
        "securityContext": container_security_context(),
        "volumeMounts": _mounts(),
    }


def collector_container(options: KubeOptions) -> dict[str, Any]:
    flags = topology.CollectorFlags(prometheus_url=options.prometheus_url)
    http = topology.COLLECTOR_HTTP_PORT
    return {
        "name": "collector",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "args": topology.collector_args(topology.ALL_INTERFACES, flags),
        "env": [*_base_env(), *_token_env()],
        "ports": [
            {"name": "http", "containerPort": http, "protocol": "TCP"},
            {"name": "grpc", "containerPort": topology.COLLECTOR_GRPC_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": http_probe(topology.HEALTH_PATH, "http", period=10, failures=6),
        "readinessProbe": http_probe(topology.READY_PATH, "http", period=5, failures=3),
        "resources": resources(("500m", "2"), ("256Mi", "1536Mi")),
        "securityContext": container_security_context(),
        "volumeMounts": _mounts(),
    }


def migration_job_name(options: KubeOptions) -> str:
    return f"inferwatch-db-upgrade-{short_hash(options.image)}"


def migration_job(options: KubeOptions) -> dict[str, Any]:
    labels = {NAME_LABEL: "inferwatch", "app.kubernetes.io/component": "db-upgrade"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(migration_job_name(options), labels),
        "spec": {
            "backoffLimit": 6,
            "template": {
                "metadata": {"labels": {**labels}},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security_context(),
                    "containers": [migration_container(options, "db-upgrade")],
                    "volumes": _volumes(),
                },
            },
        },
    }


def deployment(options: KubeOptions) -> dict[str, Any]:
    selector = collector_labels()
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(COLLECTOR, selector),
        "spec": {
            "replicas": REPLICAS,
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": {**metadata(COLLECTOR, selector)["labels"]}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security_context(),
                    "terminationGracePeriodSeconds": 30,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": selector},
                        }
                    ],
                    "initContainers": [migration_container(options, "db-upgrade")],
                    "containers": [collector_container(options)],
                    "volumes": _volumes(),
                },
            },
        },
    }


def service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(COLLECTOR, collector_labels()),
        "spec": {
            "selector": collector_labels(),
            "ports": [
                {"name": "http", "port": topology.COLLECTOR_HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "grpc", "port": topology.COLLECTOR_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
            ],
        },
    }


def disruption_budget() -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(COLLECTOR, collector_labels()),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": collector_labels()}},
    }


def autoscaler() -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(COLLECTOR, collector_labels()),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": COLLECTOR},
            "minReplicas": REPLICAS,
            "maxReplicas": MAX_REPLICAS,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": CPU_TARGET_PERCENT},
                    },
                }
            ],
        },
    }


def _port(number: int) -> dict[str, Any]:
    return {"protocol": "TCP", "port": number}


def network_policy() -> dict[str, Any]:
    """OTLP (both ports) only from engine and proxy pods; the HTTP port also from Prometheus, Alertmanager,
    Grafana and the on-call namespaces. Egress is left open (PostgreSQL, Prometheus, receivers)."""
    anywhere: dict[str, Any] = {}
    senders = [
        {
            "namespaceSelector": anywhere,
            "podSelector": {"matchExpressions": [{"key": ENGINE_LABEL, "operator": "Exists"}]},
        },
        {"namespaceSelector": anywhere, "podSelector": {"matchLabels": {PROXY_LABEL: "true"}}},
    ]
    readers: list[dict[str, Any]] = [
        {"namespaceSelector": anywhere, "podSelector": {"matchLabels": {NAME_LABEL: name}}} for name in READERS
    ]
    readers.append({"namespaceSelector": {"matchLabels": {ONCALL_LABEL: "true"}}})
    http, grpc = topology.COLLECTOR_HTTP_PORT, topology.COLLECTOR_GRPC_PORT
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(COLLECTOR, collector_labels()),
        "spec": {
            "podSelector": {"matchLabels": collector_labels()},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": senders, "ports": [_port(http), _port(grpc)]},
                {"from": readers, "ports": [_port(http)]},
            ],
        },
    }


def files(options: KubeOptions) -> dict[str, bytes]:
    """The collector's manifests by path relative to the output directory."""
    secret_note = f"Reads the Secret {SECRET} (not generated): see the comment in collector/deployment.yaml."
    return {
        "collector/deployment.yaml": dump([deployment(options)], SIZING),
        "collector/service.yaml": dump([service()]),
        "collector/migration-job.yaml": dump([migration_job(options)], secret_note),
        "collector/poddisruptionbudget.yaml": dump([disruption_budget()]),
        "collector/horizontalpodautoscaler.yaml": dump([autoscaler()]),
        "collector/networkpolicy.yaml": dump(
            [network_policy()],
            "Senders: pods labelled inferwatch.io/engine (any value) or inferwatch.io/proxy=true, any namespace.\n"
            "Readers (4318): app.kubernetes.io/name in (prometheus, alertmanager, grafana), any namespace, and\n"
            "every pod of a namespace labelled inferwatch.io/oncall=true.",
        ),
    }
