"""YAML as the generators write it: keys in the order given, no anchors or aliases (every repeated
value spelled out, as a reader of a generated file expects), multi-line strings as literal blocks,
lines up to 120 characters. Used by the alert, stack and Kubernetes generators alike."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class GeneratedDumper(yaml.SafeDumper):
    """A SafeDumper that never writes an alias (``&id001`` / ``*id001``)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


GeneratedDumper.add_representer(str, _str)


def to_yaml(doc: Any) -> str:
    """One YAML document, as the generators write it."""
    return yaml.dump(doc, Dumper=GeneratedDumper, sort_keys=False, width=120, allow_unicode=True)


def to_yaml_all(docs: Iterable[Any]) -> str:
    """YAML documents separated by ``---``, as the generators write them."""
    return yaml.dump_all(list(docs), Dumper=GeneratedDumper, sort_keys=False, width=120, allow_unicode=True)
