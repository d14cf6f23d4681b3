"""The sidecars: the exporter (and, optionally, the proxy) in the engine's pod, as patches and examples.

For each engine:

* ``sidecars/<engine>-exporter/``: a kustomize Component whose strategic-merge patch adds the
  exporter container to a Deployment named after the engine (``vllm``), with the labels the
  PodMonitor and the NetworkPolicy select. In your own kustomization: ``components:
  [<this tree>/sidecars/vllm-exporter]``; without kustomize, ``kubectl patch deployment NAME
  --type strategic --patch-file sidecars/vllm-exporter/patch.yaml`` patches one of any name.
* ``sidecars/<engine>-proxy/``: the same for the proxy, a second sidecar in front of the engine's
  API: clients (your Service's ``targetPort``) move to its port ``proxy``; its metrics and probes
  are on ``proxy-metrics``, apart, so that the engine's own /metrics still passes through.
* ``examples/engines/<engine>.yaml``: an engine Deployment and Service with the exporter already in
  (``kubectl apply -k examples/engines``), and ``examples/with-proxy/``: the same with the proxy
  Components and the Services pointed at the proxy.

The exporter scrapes ``localhost``: the containers of a pod share its network namespace. Its
probes both ask ``/healthz`` (the process serves): ``/readyz`` scrapes the engine, and an engine
still loading its model would otherwise restart nothing but make every probe a scrape.
"""

from __future__ import annotations

from typing import Any, Final

from inferwatch.core import topology
from inferwatch.core import vocabulary as V
from inferwatch.kubernetes.kube_objects import (
    ENGINE_LABEL,
    EXPORTER_CONTAINER,
    EXPORTER_LABEL,
    METRICS_PORT_NAME,
    NAME_LABEL,
    PROXY_CONTAINER,
    PROXY_LABEL,
    PROXY_METRICS_PORT_NAME,
    PROXY_PORT_NAME,
    KubeOptions,
    container_security_context,
    dump,
    http_probe,
    inline,
    metadata,
    resources,
)

COMPONENT_KIND: Final = {"apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component"}
KUSTOMIZATION_KIND: Final = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
EXAMPLE_MODEL: Final = "Qwen/Qwen2.5-7B-Instruct"
"""the model every example engine serves, and the ``model`` label its exporter publishes (the autoscaling
objects of :mod:`.autoscaling` select it): the served name where the engine reports one, llama.cpp's
``--alias``, and the exporter's ``--model`` for Triton, whose label would be the repository's model name."""
TGI_MAX_BATCH_TOTAL_TOKENS: Final = 16384
"""the example TGI's ``--max-batch-total-tokens``, which its exporter needs as an option for KV-cache usage."""
EXPORTER_SIZING: Final = (
    'Exporter: 51-54 MB resident idle (docs/deploy.md, "Installing one part"): requests 50m/64Mi, limits 500m/128Mi.'
)
PROXY_SIZING: Final = "Proxy: 60 MB resident idle (docs/deploy.md): requests 100m/96Mi, limits 1/256Mi."


def _exporter_options(engine: str, example: bool) -> tuple[tuple[str, str], ...]:
    if engine == V.ENGINE_TGI and example:
        return (("max_batch_total_tokens", str(TGI_MAX_BATCH_TOTAL_TOKENS)),)
    return ()


def exporter_container(engine: str, options: KubeOptions, *, example: bool = False) -> dict[str, Any]:
    """The exporter beside ``engine`` in its pod: target ``localhost``, port ``metrics``, restricted."""
    facts = topology.engine_facts(engine)
    model = EXAMPLE_MODEL if example and engine == V.ENGINE_TRITON else None
    args = topology.exporter_args(
        engine, facts.exporter_target("localhost"), model=model, options=_exporter_options(engine, example)
    )
    container: dict[str, Any] = {
        "name": EXPORTER_CONTAINER,
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": topology.EXPORTER_PORT, "protocol": "TCP"}],
        "livenessProbe": http_probe(topology.HEALTH_PATH, METRICS_PORT_NAME),
        "readinessProbe": http_probe(topology.HEALTH_PATH, METRICS_PORT_NAME),
        "resources": resources(("50m", "500m"), ("64Mi", "128Mi")),
        "securityContext": container_security_context(),
    }
    if options.gpu_source is not None:
        # the GPUs dcgm-exporter labels with this pod: its name and namespace, and the node's address
        container["args"] = [*args, f"--gpu-source={options.gpu_source}", "--gpu-pod-from-env"]
        container["env"] = [_downward(name, path) for name, path in GPU_ENV]
    return container


GPU_ENV = (
    (topology.POD_NAME_ENV, "metadata.name"),
    (topology.POD_NAMESPACE_ENV, "metadata.namespace"),
    ("HOST_IP", "status.hostIP"),
)
"""The downward API's facts an exporter joining its pod's GPUs reads (``--gpu-pod-from-env``, the URL's host)."""


def _downward(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def proxy_container(engine: str, options: KubeOptions) -> dict[str, Any]:
    """The proxy in front of the engine's API (``localhost``), clients on ``proxy``, metrics on ``proxy-metrics``."""
    facts = topology.engine_facts(engine)
    upstream = topology.url("localhost", facts.serving_port)
    return {
        "name": PROXY_CONTAINER,
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "args": topology.proxy_args(engine, upstream),
        "ports": [
            {"name": PROXY_PORT_NAME, "containerPort": topology.PROXY_PORT, "protocol": "TCP"},
            {"name": PROXY_METRICS_PORT_NAME, "containerPort": topology.PROXY_METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": http_probe(topology.HEALTH_PATH, PROXY_METRICS_PORT_NAME),
        "readinessProbe": http_probe(topology.READY_PATH, PROXY_METRICS_PORT_NAME),
        "resources": resources(("100m", "1"), ("96Mi", "256Mi")),
        "securityContext": container_security_context(),
    }


def _patch(engine: str, labels: dict[str, str], container: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": engine},
        "spec": {"template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}}},
    }


def exporter_patch(engine: str, options: KubeOptions) -> dict[str, Any]:
    labels = {ENGINE_LABEL: engine, EXPORTER_LABEL: "true"}
    return _patch(engine, labels, exporter_container(engine, options))


def proxy_patch(engine: str, options: KubeOptions) -> dict[str, Any]:
    labels = {ENGINE_LABEL: engine, PROXY_LABEL: "true"}
    return _patch(engine, labels, proxy_container(engine, options))


def _engine_container(engine: str) -> dict[str, Any]:
    """The engine as its official image runs it, on its default ports, with one GPU."""
    facts = topology.engine_facts(engine)
    port = facts.serving_port
    launch: dict[str, dict[str, Any]] = {
        V.ENGINE_VLLM: {"args": ["--model", EXAMPLE_MODEL, "--port", str(port)]},
        V.ENGINE_TGI: {
            "args": [
                "--model-id",
                EXAMPLE_MODEL,
                "--max-batch-total-tokens",
                str(TGI_MAX_BATCH_TOTAL_TOKENS),
            ]
        },
        V.ENGINE_TRTLLM: {
            "command": ["trtllm-serve"],
            "args": [
                EXAMPLE_MODEL,
                "--host=0.0.0.0",
                f"--port={port}",
                "--extra_llm_api_options=/etc/trtllm/extra-llm-api-options.yaml",
            ],
            "volumeMounts": [{"name": "trtllm-options", "mountPath": "/etc/trtllm", "readOnly": True}],
        },
        V.ENGINE_TRITON: {
            "command": ["tritonserver"],
            "args": ["--model-repository=/models", f"--http-port={port}", f"--metrics-port={facts.metrics_port}"],
            "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
        },
        V.ENGINE_SGLANG: {
            "command": ["python3", "-m", "sglang.launch_server"],
            "args": [
                "--model-path",
                EXAMPLE_MODEL,
                "--host",
                "0.0.0.0",
                "--port",
                str(port),
                "--enable-metrics",
            ],
        },
        V.ENGINE_LLAMACPP: {
            # the image's entrypoint is llama-server; -hf fetches the GGUF from the Hugging Face hub; --alias
            # names the model (its /props and /v1/models, so the exporter's model label) as the other examples
            "args": [
                "-hf",
                "Qwen/Qwen2.5-7B-Instruct-GGUF:Q4_K_M",
                "--alias",
                EXAMPLE_MODEL,
                "--host",
                "0.0.0.0",
                "--port",
                str(port),
                "-ngl",
                "99",
                "--parallel",
                "4",
                "--metrics",
            ],
        },
    }
    ports = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    if facts.metrics_port != port:
        ports.append({"name": "engine-metrics", "containerPort": facts.metrics_port, "protocol": "TCP"})
    return {
        "name": engine,
        "image": facts.image,
        **launch[engine],
        "ports": ports,
        "readinessProbe": http_probe(facts.health_path, "http", period=10, failures=3),
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }


def _engine_volumes(engine: str) -> list[dict[str, Any]]:
    if engine == V.ENGINE_TRTLLM:
        return [{"name": "trtllm-options", "configMap": {"name": "trtllm-options"}}]
    if engine == V.ENGINE_TRITON:
        return [{"name": "models", "persistentVolumeClaim": {"claimName": "triton-models", "readOnly": True}}]
    return []


def example_deployment(engine: str, options: KubeOptions) -> dict[str, Any]:
    selector = {NAME_LABEL: engine}
    pod_labels = {**selector, ENGINE_LABEL: engine, EXPORTER_LABEL: "true"}
    pod: dict[str, Any] = {"containers": [_engine_container(engine), exporter_container(engine, options, example=True)]}
    if volumes := _engine_volumes(engine):
        pod["volumes"] = volumes
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(engine, selector),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": pod_labels}, "spec": pod},
        },
    }


def example_service(engine: str) -> dict[str, Any]:
    port = topology.engine_facts(engine).serving_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(engine, {NAME_LABEL: engine}),
        "spec": {
            "selector": {NAME_LABEL: engine},
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _example_extras(engine: str) -> list[dict[str, Any]]:
    if engine != V.ENGINE_TRTLLM:
        return []
    options = "return_perf_metrics: true\nenable_iter_perf_stats: true\n"
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata("trtllm-options", {NAME_LABEL: engine}),
            "data": {"extra-llm-api-options.yaml": options},
        }
    ]


def _component(note: str) -> bytes:
    return dump([{**COMPONENT_KIND, "patches": [{"path": "patch.yaml"}]}], note)


def _proxy_service_patch(engine: str) -> dict[str, Any]:
    port = topology.engine_facts(engine).serving_port
    patch = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": engine}}
    patch["spec"] = {"ports": [{"name": "http", "port": port, "targetPort": PROXY_PORT_NAME, "protocol": "TCP"}]}
    return patch


def files(options: KubeOptions) -> dict[str, bytes]:
    """Patches, Components and examples by path relative to the output directory."""
    out: dict[str, bytes] = {}
    tgi_note = "TGI: add --engine-option=max_batch_total_tokens=N (TGI's --max-batch-total-tokens) for KV-cache usage."
    for engine in options.engines:
        note = tgi_note if engine == V.ENGINE_TGI else ""
        out[f"sidecars/{engine}-exporter/patch.yaml"] = dump([exporter_patch(engine, options)], EXPORTER_SIZING)
        out[f"sidecars/{engine}-exporter/kustomization.yaml"] = _component(
            f"Adds the exporter to the Deployment {engine}: list this directory in your kustomization's components.\n"
            + note
        )
        out[f"sidecars/{engine}-proxy/patch.yaml"] = dump([proxy_patch(engine, options)], PROXY_SIZING)
        out[f"sidecars/{engine}-proxy/kustomization.yaml"] = _component(
            f"Adds the proxy to the Deployment {engine}; point your Service's targetPort at its port {PROXY_PORT_NAME}."
        )
        docs = [*_example_extras(engine), example_deployment(engine, options), example_service(engine)]
        out[f"examples/engines/{engine}.yaml"] = dump(
            docs, f"An example {engine} with the exporter sidecar. {EXPORTER_SIZING}"
        )
    examples = {**KUSTOMIZATION_KIND, "resources": [f"{e}.yaml" for e in options.engines]}
    out["examples/engines/kustomization.yaml"] = dump(
        [examples], "Example engines (each wants a GPU): kubectl apply -k examples/engines"
    )
    with_proxy = {
        **KUSTOMIZATION_KIND,
        "resources": ["../engines"],
        "components": [f"../../sidecars/{e}-proxy" for e in options.engines],
        "patches": [{"patch": inline(_proxy_service_patch(e))} for e in options.engines],
    }
    out["examples/with-proxy/kustomization.yaml"] = dump(
        [with_proxy], "The example engines with the proxy in front of each API: kubectl apply -k examples/with-proxy"
    )
    return out
