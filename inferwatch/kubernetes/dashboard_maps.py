"""Grafana dashboards on Kubernetes: one ConfigMap per dashboard of ``inferwatch generate dashboards``.

Grafana's dashboard sidecar (the Grafana Helm chart's, which kube-prometheus-stack uses) loads every
ConfigMap carrying its label, ``grafana_dashboard: "1"`` by default (``sidecar.dashboards.label`` and
``labelValue``). The folder comes from an annotation whose key the chart's
``sidecar.dashboards.folderAnnotation`` names; left unset, the sidecar reads its own default,
``k8s-sidecar-target-directory``, and many installations set ``grafana_folder``: each ConfigMap carries
both, with the folder name (a directory under the sidecar's, which the provider's
``foldersFromFilesStructure: true`` shows as a folder). With ``grafana_operator``, a GrafanaDashboard
(grafana-operator, ``grafana.integreatly.org/v1beta1``) per dashboard reads the same ConfigMap.

The JSON is the dashboards' own: their datasources are template variables, so any Prometheus does.
The largest is under 150 kB, well below a ConfigMap's 1 MiB and ``kubectl apply``'s 256 kB annotation.
"""

from __future__ import annotations

from typing import Any, Final

from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLOFile
from inferwatch.dashboards.generate import generate as generate_dashboards
from inferwatch.kubernetes.kube_objects import NAME_LABEL, KubeOptions, dump, metadata

FOLDER_ANNOTATIONS: Final = ("grafana_folder", "k8s-sidecar-target-directory")


def dashboard_jsons(spec: SLOFile, vocabulary: V.Vocabulary) -> dict[str, str]:
    """``generate dashboards``' dashboard files by name (``inferwatch-fleet.json``), provisioning left out."""
    return {name: content for name, content in generate_dashboards(spec, vocabulary).items() if name.endswith(".json")}


def map_name(file_name: str) -> str:
    """``inferwatch-fleet.json`` -> ``inferwatch-dashboard-fleet``."""
    return "inferwatch-dashboard-" + file_name.removesuffix(".json").removeprefix("inferwatch-")


def config_map(file_name: str, content: str, options: KubeOptions) -> dict[str, Any]:
    key, value = options.grafana_label
    meta = metadata(map_name(file_name), {NAME_LABEL: "inferwatch", key: value})
    meta["annotations"] = {annotation: options.grafana_folder for annotation in FOLDER_ANNOTATIONS}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {file_name: content}}


def grafana_dashboard(file_name: str, options: KubeOptions) -> dict[str, Any]:
    return {
        "apiVersion": "grafana.integreatly.org/v1beta1",
        "kind": "GrafanaDashboard",
        "metadata": metadata(map_name(file_name)),
        "spec": {
            "instanceSelector": {"matchLabels": dict(options.grafana_instance_labels)},
            "allowCrossNamespaceImport": True,
            "folder": options.grafana_folder,
            "configMapRef": {"name": map_name(file_name), "key": file_name},
        },
    }


def files(spec: SLOFile, vocabulary: V.Vocabulary, options: KubeOptions) -> dict[str, bytes]:
    """The dashboards' ConfigMaps (and GrafanaDashboards) by path relative to the output directory."""
    out: dict[str, bytes] = {}
    key, value = options.grafana_label
    for name, content in dashboard_jsons(spec, vocabulary).items():
        stem = name.removesuffix(".json")
        note = f"The dashboard {name} of `inferwatch generate dashboards`, for Grafana's sidecar ({key}={value})."
        out[f"dashboards/{stem}.yaml"] = dump([config_map(name, content, options)], note)
        if options.grafana_operator:
            out[f"dashboards/{stem}-grafanadashboard.yaml"] = dump([grafana_dashboard(name, options)])
    return out
