"""Kubernetes objects checked against the real schemas (issue 31): :func:`validate_object`.

* **Core kinds** (Deployment, Service, ConfigMap, Job, HorizontalPodAutoscaler, NetworkPolicy, ...):
  Kubernetes' own OpenAPI schemas for :data:`KUBERNETES_VERSION`, as ``kubernetes-validate`` ships them
  in strict mode (``additionalProperties: false`` everywhere: a misspelled field fails). Every error is
  reported, not only the first. A strategic-merge patch is a partial object: ``partial=True`` keeps the
  field names and types strict but does not ask for the required fields the patch leaves to its target.
* **Prometheus Operator kinds** (PodMonitor, ServiceMonitor, PrometheusRule, Probe, AlertmanagerConfig,
  ScrapeConfig, ...): the pydantic models of ``cloudcoil-models-prometheus-operator``, generated from the
  operator's CRDs (:data:`PROMETHEUS_OPERATOR_VERSION`), parsed in strict mode (no ``"true"`` for a
  boolean, no ``"5"`` for an integer). The models *ignore* unknown fields (pydantic's default) and accept
  the Python names of fields (``scrape_timeout`` for ``scrapeTimeout``), so the parsed model is written
  back with the schema's names and compared with the input: a field it lost (unknown) or changed is an error.
* **KEDA kinds** (ScaledObject, TriggerAuthentication, ...): the same way, with the pydantic models of
  ``cloudcoil-models-keda`` (:data:`KEDA_VERSION`), generated from KEDA's CRDs.
* **CRDs no installable package describes** (grafana-operator's GrafanaDashboard): the ``openAPIV3Schema``
  the project publishes in its CRD, stored under ``tests/fixtures/crds/`` (:data:`CRD_SCHEMAS`; where each
  comes from: ``SOURCE.md`` there), checked with ``jsonschema`` as the API server reads a structural schema:
  a field an object's ``properties`` do not name is an error (the server prunes it, or refuses it under
  strict field validation) unless ``x-kubernetes-preserve-unknown-fields``; ``metadata`` is Kubernetes'
  ObjectMeta (strict); the ``byte``, ``int64`` and ``date-time`` formats are checked. The CRD's CEL rules
  (``x-kubernetes-validations``) are not evaluated.
* Anything else: the error ``no schema for KIND``. :data:`UNVALIDATED_KINDS` names the kinds the
  generator may emit that nothing here describes, and why (none at present).

Also here: :func:`alertmanager_yml`, an AlertmanagerConfig rendered as the operator renders it (for amtool),
and :class:`Tree`, a directory of manifests and its kustomizations, read with a loader that refuses
duplicate keys.
"""

from __future__ import annotations

import base64
import binascii
import copy
import datetime
import functools
import importlib.metadata
import importlib.resources
import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pydantic
import referencing
import yaml
from cloudcoil.models.keda import v1alpha1 as keda_v1alpha1
from cloudcoil.models.prometheus_operator import v1 as promop_v1
from cloudcoil.models.prometheus_operator import v1alpha1 as promop_v1alpha1
from cloudcoil.resources import Resource

KUBERNETES_VERSION = "1.32"
"""The Kubernetes release whose API schemas the core kinds are checked against (kubernetes-validate ships
one strict set per minor release): recent, and old enough that the manifests suit clusters not upgraded
every quarter."""

PROMETHEUS_OPERATOR_VERSION = importlib.metadata.version("cloudcoil-models-prometheus-operator")
"""The Prometheus Operator release whose CRDs the models were generated from, plus a build number
(0.80.1.0 is v0.80.1, the newest the package has for Python 3.11)."""

KEDA_VERSION = importlib.metadata.version("cloudcoil-models-keda")
"""The KEDA release whose CRDs the models were generated from, plus a build number (2.16.1.0 is v2.16.1, the
newest the package has for Python 3.11; the ScaledObject fields the tree uses are older than 2.16)."""

UNVALIDATED_KINDS: dict[tuple[str, str], str] = {}
"""(API group, kind) → why no schema checks it."""

CRD_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "crds"
CRD_SCHEMAS: dict[tuple[str, str], str] = {
    ("grafana.integreatly.org/v1beta1", "GrafanaDashboard"): "grafana.integreatly.org_grafanadashboards.v1beta1.json",
}
"""(apiVersion, kind) → the file under :data:`CRD_FIXTURES` holding the CRD's ``openAPIV3Schema`` for that version."""

_SCHEMA_ROOT = "kubernetes-json-schema"


def _loc(loc: tuple[int | str, ...]) -> str:
    """``spec.containers[0].name``: where in an object."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "(root)"


def _group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


# --- core kinds: Kubernetes' OpenAPI schemas --------------------------------------------------------
def _no_required(validator: Any, required: Any, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    """``required`` switched off (partial objects: strategic-merge patches)."""
    return iter(())


_PartialValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"required": _no_required})


@functools.cache
def schema_dir() -> str:
    """The strict schema directory of :data:`KUBERNETES_VERSION` shipped by kubernetes-validate."""
    root = importlib.resources.files("kubernetes_validate").joinpath(_SCHEMA_ROOT)
    wanted = re.compile(rf"^v{re.escape(KUBERNETES_VERSION)}\.\d+-local-strict$")
    found = sorted(entry.name for entry in root.iterdir() if wanted.match(entry.name))
    if not found:
        raise RuntimeError(f"kubernetes-validate ships no strict schemas for Kubernetes {KUBERNETES_VERSION}")
    return found[-1]


@functools.cache
def _load(filename: str) -> dict[str, Any] | None:
    path = importlib.resources.files("kubernetes_validate").joinpath(_SCHEMA_ROOT, schema_dir(), filename)
    if not path.is_file():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


@functools.cache
def _registry() -> referencing.Registry[Any]:
    definitions = _load("_definitions.json")
    assert definitions is not None, "kubernetes-validate's _definitions.json is missing"
    return referencing.Resource.from_contents(definitions) @ referencing.Registry()


def _core_schema(group: str, version: str, kind: str) -> dict[str, Any] | None:
    """The top-level schema of ``kind`` (None when Kubernetes has no such object)."""
    short_group = group.split(".", 1)[0]
    schema = _load(f"{kind.lower()}-{short_group}-{version}.json" if group else f"{kind.lower()}-{version}.json")
    if schema is None:
        return None
    # a file exists for every type (DeploymentSpec too): only a real object carries its group/version/kind
    gvks = schema.get("x-kubernetes-group-version-kind", [])
    if {"group": group, "version": version, "kind": kind} not in gvks:
        return None
    return schema


def _messages(validator: Any, doc: dict[str, Any]) -> list[str]:
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{_loc(tuple(e.absolute_path))}: {e.message}" for e in errors]


def _core_errors(schema: dict[str, Any], doc: dict[str, Any], partial: bool) -> list[str]:
    cls = _PartialValidator if partial else jsonschema.Draft202012Validator
    return _messages(cls(schema, registry=_registry()), doc)


# --- CRDs without a package: their published openAPIV3Schema ------------------------------------
_OBJECT_META = "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_FORMATS = jsonschema.FormatChecker(formats=())


def _is_base64(value: object) -> bool:
    return not isinstance(value, str) or base64.b64decode(value, validate=True) is not None


def _is_int64(value: object) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


def _is_date_time(value: object) -> bool:
    return not isinstance(value, str) or ("T" in value.upper() and bool(datetime.datetime.fromisoformat(value)))


_FORMATS.checks("byte", raises=(binascii.Error, ValueError))(_is_base64)
_FORMATS.checks("int64")(_is_int64)
_FORMATS.checks("date-time", raises=ValueError)(_is_date_time)


def _structural(node: dict[str, Any]) -> dict[str, Any]:
    """One node of a structural schema as plain JSON Schema: an object without ``additionalProperties``
    admits no field its ``properties`` do not name (unless ``x-kubernetes-preserve-unknown-fields``),
    ``nullable`` admits null, ``x-kubernetes-int-or-string`` an integer or a string."""
    out = dict(node)
    if "properties" in out:
        out["properties"] = {name: _structural(sub) for name, sub in out["properties"].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(out.get(key), dict):
            out[key] = _structural(out[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in out:
            out[key] = [_structural(sub) for sub in out[key]]
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [*out.get("anyOf", []), {"type": "integer"}, {"type": "string"}]
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    preserve = out.get("x-kubernetes-preserve-unknown-fields", False)
    if out.get("type") == "object" and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return out


@functools.cache
def _crd_validator(file_name: str) -> Any:
    schema = _structural(json.loads((CRD_FIXTURES / file_name).read_text()))
    schema["properties"]["metadata"] = {"$ref": _OBJECT_META}
    return jsonschema.Draft202012Validator(schema, registry=_registry(), format_checker=_FORMATS)


# --- Prometheus Operator and KEDA kinds: cloudcoil's models ---------------------------------------
@functools.cache
def _crd_models() -> dict[tuple[str, str], type[Resource]]:
    """(apiVersion, kind) → the model of every Prometheus Operator and KEDA resource the packages hold."""
    models: dict[tuple[str, str], type[Resource]] = {}
    for module in (promop_v1, promop_v1alpha1, keda_v1alpha1):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Resource) and cls.__module__ == module.__name__:
                gvk = cls.gvk()
                models[(gvk.api_version, gvk.kind)] = cls
    return models


def _lost_fields(given: Any, kept: Any, path: str) -> Iterator[str]:
    """Where the re-serialised model differs from the input: fields it dropped or values it changed."""
    if isinstance(given, dict) and isinstance(kept, dict):
        for key, value in given.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in kept:
                yield f"{where}: unknown field (not in the schema, dropped by the model)"
            else:
                yield from _lost_fields(value, kept[key], where)
    elif isinstance(given, list) and isinstance(kept, list) and len(given) == len(kept):
        for index, (a, b) in enumerate(zip(given, kept, strict=True)):
            yield from _lost_fields(a, b, f"{path}[{index}]")
    elif given != kept or isinstance(given, bool) != isinstance(kept, bool):
        yield f"{path or '(root)'}: {given!r} was read as {kept!r}"


def _crd_errors(model: type[Resource], doc: dict[str, Any]) -> list[str]:
    try:
        parsed = model.model_validate_json(json.dumps(doc), strict=True)
    except pydantic.ValidationError as exc:
        return [f"{_loc(e['loc'])}: {e['msg']} (got {e.get('input')!r})"[:500] for e in exc.errors()]
    kept = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return list(_lost_fields(doc, kept, ""))


# --- the entry point ---------------------------------------------------------------------------
def _identity_errors(doc: Any) -> list[str]:
    if not isinstance(doc, dict):
        return [f"(root): an object must be a mapping, not {type(doc).__name__}"]
    errors = [f"{key}: required" for key in ("apiVersion", "kind") if not isinstance(doc.get(key), str)]
    return errors


def validate_object(doc: dict[str, Any], *, partial: bool = False) -> list[str]:
    """The schema errors of one Kubernetes object (empty when it is valid).

    ``partial``: a strategic-merge patch of a core kind (required fields not asked for; names and types are).
    """
    errors = _identity_errors(doc)
    if errors:
        return errors
    api_version, kind = doc["apiVersion"], doc["kind"]
    group, version = _group_version(api_version)
    if not partial and not (isinstance(doc.get("metadata"), dict) and doc["metadata"].get("name")):
        errors.append("metadata.name: required")
    model, crd_file = _crd_models().get((api_version, kind)), CRD_SCHEMAS.get((api_version, kind))
    if (model or crd_file) and partial:
        return [f"no partial schema for {kind}: only core kinds can be checked as patches"]
    if model is not None:
        return errors + _crd_errors(model, doc)
    if crd_file is not None:
        return errors + _messages(_crd_validator(crd_file), doc)
    schema = _core_schema(group, version, kind)
    if schema is not None:
        return errors + _core_errors(schema, doc, partial)
    why = UNVALIDATED_KINDS.get((group, kind))
    return [f"no schema for {kind} ({api_version})" + (f": {why}" if why else "")]


def changed(doc: dict[str, Any], path: str, value: Any = None, *, delete: bool = False) -> dict[str, Any]:
    """A deep copy of ``doc`` with the field at ``path`` (dots; digits index lists) set or deleted."""
    out = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node: Any = out
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    if delete:
        del node[int(last) if last.isdigit() else last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return out


# --- an AlertmanagerConfig as the operator renders it into alertmanager.yml -----------------------
NULL_RECEIVER = "null"
"""The receiver of the operator's top-level route: alerts no AlertmanagerConfig matched go nowhere."""

_ROUTE_KEYS = {
    "receiver": "receiver",
    "groupBy": "group_by",
    "groupWait": "group_wait",
    "groupInterval": "group_interval",
    "repeatInterval": "repeat_interval",
    "continue": "continue",
    "muteTimeIntervals": "mute_time_intervals",
    "activeTimeIntervals": "active_time_intervals",
}
_WEBHOOK_KEYS = {"url": "url", "sendResolved": "send_resolved", "maxAlerts": "max_alerts", "timeout": "timeout"}


def _matcher(m: dict[str, Any]) -> str:
    op = m.get("matchType") or ("=~" if m.get("regex") else "=")
    return f"{m['name']}{op}{json.dumps(m.get('value', ''))}"


def _route(route: dict[str, Any], prefix: str) -> dict[str, Any]:
    unknown = set(route) - set(_ROUTE_KEYS) - {"matchers", "routes"}
    if unknown:
        raise ValueError(f"route fields this rendering does not know: {sorted(unknown)}")
    out: dict[str, Any] = {_ROUTE_KEYS[k]: v for k, v in route.items() if k in _ROUTE_KEYS}
    if "receiver" in out:
        out["receiver"] = prefix + out["receiver"]
    if route.get("matchers"):
        out["matchers"] = [_matcher(m) for m in route["matchers"]]
    if route.get("routes"):
        out["routes"] = [_route(r, prefix) for r in route["routes"]]
    return out


def _webhook(config: dict[str, Any], secrets_dir: str) -> dict[str, Any]:
    unknown = set(config) - set(_WEBHOOK_KEYS) - {"httpConfig"}
    if unknown:
        raise ValueError(f"webhook fields this rendering does not know: {sorted(unknown)}")
    out: dict[str, Any] = {_WEBHOOK_KEYS[k]: v for k, v in config.items() if k in _WEBHOOK_KEYS}
    http = dict(config.get("httpConfig") or {})
    auth = http.pop("authorization", None)
    if http:
        raise ValueError(f"httpConfig fields this rendering does not know: {sorted(http)}")
    if auth is not None:
        ref = auth["credentials"]
        out["http_config"] = {
            "authorization": {
                "type": auth.get("type", "Bearer"),
                "credentials_file": f"{secrets_dir}/{ref['name']}/{ref['key']}",
            }
        }
    return out


def alertmanager_yml(amc: dict[str, Any], secrets_dir: str, namespace_matcher: str | None = None) -> dict[str, Any]:
    """The alertmanager.yml the Prometheus Operator renders from one AlertmanagerConfig ``amc``.

    As the operator does: receivers are named ``NAMESPACE/NAME/RECEIVER``; the config's route becomes a
    child (``continue: true``) of a top-level route whose receiver is :data:`NULL_RECEIVER`; with the
    Alertmanager's ``alertmanagerConfigMatcherStrategy`` ``OnNamespace`` (the operator's default) the
    route also matches ``namespace="<namespace_matcher>"`` only, with ``None`` it does not
    (``namespace_matcher=None``). The token of a webhook's ``authorization`` is read from
    ``secrets_dir/SECRET/KEY`` (``credentials_file``); inhibition rules get the namespace matcher too (on
    both sides) under ``OnNamespace``. Fields this rendering does not know raise
    ``ValueError`` rather than being dropped.
    """
    meta, spec = amc["metadata"], amc["spec"]
    prefix = f"{meta.get('namespace', 'default')}/{meta['name']}/"
    unknown = set(spec) - {"route", "receivers", "inhibitRules"}
    if unknown:
        raise ValueError(f"AlertmanagerConfig fields this rendering does not know: {sorted(unknown)}")
    route = _route(spec["route"], prefix)
    if namespace_matcher is not None:
        route["matchers"] = [f"namespace={json.dumps(namespace_matcher)}", *route.get("matchers", [])]
    route["continue"] = True
    receivers: list[dict[str, Any]] = [{"name": NULL_RECEIVER}]
    for receiver in spec.get("receivers", []):
        kinds = set(receiver) - {"name"}
        if kinds - {"webhookConfigs"}:
            raise ValueError(f"receiver kinds this rendering does not know: {sorted(kinds - {'webhookConfigs'})}")
        configs = [_webhook(c, secrets_dir) for c in receiver.get("webhookConfigs", [])]
        receivers.append({"name": prefix + receiver["name"], **({"webhook_configs": configs} if configs else {})})
    own = [f"namespace={json.dumps(namespace_matcher)}"] if namespace_matcher is not None else []
    inhibit = [
        {
            "source_matchers": own + [_matcher(m) for m in rule.get("sourceMatch", [])],
            "target_matchers": own + [_matcher(m) for m in rule.get("targetMatch", [])],
            **({"equal": rule["equal"]} if rule.get("equal") else {}),
        }
        for rule in spec.get("inhibitRules", [])
    ]
    config: dict[str, Any] = {"route": {"receiver": NULL_RECEIVER, "routes": [route]}, "receivers": receivers}
    return config | ({"inhibit_rules": inhibit} if inhibit else {})


# --- a tree of manifests and its kustomizations ---------------------------------------------------
KUSTOMIZATIONS = frozenset({"kustomization.yaml", "kustomization.yml", "Kustomization"})


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a mapping with the same key twice (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        duplicates = sorted({str(k) for k in keys if keys.count(k) > 1})
        if duplicates:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {duplicates}", node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _plain_string(loader: _UniqueKeyLoader, node: yaml.Node) -> str:
    assert isinstance(node, yaml.ScalarNode)
    return str(loader.construct_scalar(node))


# A plain ``=`` (kustomize writes ``matchType: =`` unquoted) is YAML 1.1's "value" tag to PyYAML, a string to
# Kubernetes' YAML 1.2 reader.
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:value", _plain_string)


def load_all(text: str) -> list[dict[str, Any]]:
    """The documents of a YAML stream (empty ones left out); a duplicate key is an error."""
    return [doc for doc in yaml.load_all(text, Loader=_UniqueKeyLoader) if doc is not None]


def identity(doc: dict[str, Any]) -> tuple[str, str, str]:
    return (doc["apiVersion"], doc["kind"], doc["metadata"]["name"])


def kustomization(directory: Path) -> dict[str, Any]:
    found = [directory / name for name in sorted(KUSTOMIZATIONS) if (directory / name).is_file()]
    assert found, f"{directory}: no kustomization"
    spec: dict[str, Any] = yaml.safe_load(found[0].read_text()) or {}
    return spec


def patch_entries(spec: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The patch files a kustomization names, and its inline patches."""
    entries = spec.get("patches", []) + spec.get("patchesStrategicMerge", [])
    paths = [e if isinstance(e, str) else e.get("path") for e in entries]
    inline = [e["patch"] for e in entries if isinstance(e, dict) and "patch" in e]
    return [p for p in paths if p], inline


def referenced(directory: Path) -> tuple[set[Path], set[Path]]:
    """(resource files, patch files) a kustomization reaches: its own, and those of the kustomizations
    and components it names (followed into directories)."""
    spec = kustomization(directory)
    resources: set[Path] = set()
    patches = {(directory / p).resolve() for p in patch_entries(spec)[0]}
    for entry in spec.get("resources", []) + spec.get("components", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            more, more_patches = referenced(target)
            resources |= more
            patches |= more_patches
        else:
            resources.add(target)
    return resources, patches


class Tree:
    """A directory of manifests with kustomizations (``deploy/kubernetes/``); empty when it is missing."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def written(cls, root: Path, files: dict[str, bytes]) -> Tree:
        """``files`` (relative path -> content, as the generator returns them) written under ``root``."""
        for name, content in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(content)
        return cls(root)

    def kustomization_files(self) -> list[Path]:
        return sorted(p for p in self.root.rglob("*") if p.name in KUSTOMIZATIONS) if self.root.is_dir() else []

    def manifest_files(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        files = self.root.rglob("*")
        return sorted(p for p in files if p.suffix in {".yaml", ".yml"} and p.name not in KUSTOMIZATIONS)

    def patch_files(self) -> set[Path]:
        return {p for k in self.kustomization_files() for p in referenced(k.parent)[1]}

    def is_patch(self, path: Path) -> bool:
        return path.resolve() in self.patch_files()

    def documents(self) -> Iterator[tuple[str, Path | None, dict[str, Any]]]:
        """(id, file, document) of every document of the tree, and of the inline patches of its
        kustomizations (file None)."""
        for path in self.manifest_files():
            rel = path.relative_to(self.root).as_posix()
            for index, doc in enumerate(load_all(path.read_text())):
                yield f"{rel}#{index}:{doc.get('kind')}/{doc.get('metadata', {}).get('name')}", path, doc
        for path in self.kustomization_files():
            for index, text in enumerate(patch_entries(kustomization(path.parent))[1]):
                for doc in load_all(text):
                    yield f"{path.relative_to(self.root).as_posix()}:patch{index}", None, doc

    def objects(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The objects (not patches) of the tree's files, of one ``kind`` or all."""
        docs = [doc for path in self.manifest_files() if not self.is_patch(path) for doc in load_all(path.read_text())]
        return [doc for doc in docs if kind is None or doc.get("kind") == kind]

    def _dirs(self, component: bool) -> list[Path]:
        return [
            k.parent
            for k in self.kustomization_files()
            if (kustomization(k.parent).get("kind", "Kustomization") == "Component") == component
        ]

    def builds(self) -> list[Path]:
        """The directories ``kubectl kustomize`` builds: the tree's Kustomizations."""
        return self._dirs(component=False)

    def components(self) -> list[Path]:
        """The tree's kustomize Components (patches a user lists in their own kustomization)."""
        return self._dirs(component=True)
