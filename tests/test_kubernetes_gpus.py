"""`inferwatch generate kubernetes --gpu-source URL` (issue 34): every exporter sidecar joins the GPUs that
dcgm-exporter labels with its own pod. The pod's name, namespace and node address come from the downward API;
the objects still validate against the cluster's schemas, and without the option nothing changes."""

from __future__ import annotations

from typing import Any

import yaml

from inferwatch.core import topology
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import load
from inferwatch.kubernetes.kube_objects import EXPORTER_CONTAINER, KubeOptions
from inferwatch.kubernetes.manifests import generate
from tests.conftest import ROOT
from tests.support import kube_schemas as K

URL = "http://$(HOST_IP):9400/metrics"


def _exporters(files: dict[str, bytes]) -> dict[str, list[dict[str, Any]]]:
    """The exporter containers of every generated object, by file."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, content in files.items():
        if not name.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(content):
            spec = ((doc or {}).get("spec") or {}).get("template", {}).get("spec", {})
            found = [c for c in spec.get("containers", []) if c.get("name") == EXPORTER_CONTAINER]
            if found:
                out.setdefault(name, []).extend(found)
    return out


def _generate(options: KubeOptions) -> dict[str, bytes]:
    vocab = V.Vocabulary()
    return generate(load(ROOT / "alerts" / "slos.yaml", vocab), vocab, options)


def test_every_exporter_sidecar_joins_its_pods_gpus() -> None:
    files = _generate(KubeOptions(gpu_source=URL))
    exporters = _exporters(files)
    assert len(exporters) >= 2 * len(V.ENGINES), sorted(exporters)  # a patch and an example per engine
    for name, containers in exporters.items():
        for c in containers:
            assert c["args"][-2:] == [f"--gpu-source={URL}", "--gpu-pod-from-env"], name
            env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
            assert env == {
                topology.POD_NAME_ENV: "metadata.name",
                topology.POD_NAMESPACE_ENV: "metadata.namespace",
                "HOST_IP": "status.hostIP",
            }, name
    for name in exporters:
        for doc in yaml.safe_load_all(files[name]):
            if doc:
                assert not K.validate_object(doc, partial="sidecars/" in name), name


def test_without_the_option_no_exporter_reads_a_gpu_source() -> None:
    exporters = _exporters(_generate(KubeOptions()))
    assert len(exporters) >= 2 * len(V.ENGINES)
    for containers in exporters.values():
        for c in containers:
            assert "env" not in c and not any(a.startswith("--gpu") for a in c["args"])
