"""YAML files whose errors name the line: the document with the line of every node path.

Shared by the files a user writes (the SLO file, the collector's notify file): they validate the
data with pydantic and turn each error's ``loc`` into ``line N: a.0.b: message``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

NodePath = tuple[Any, ...]
"""A node path: mapping keys (str) and sequence indexes (int), as in a pydantic error's ``loc``."""


class YAMLSyntaxError(ValueError):
    """The text is not YAML; ``line`` (1-based) where the parser gave up, when it says."""

    def __init__(self, problem: str, line: int | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.line = line


class FieldError(ValueError):
    """Raised by a validator about a part of the value it validates: ``subpath`` is appended to the
    error's ``loc`` (e.g. a model validator blaming ``("token_env",)``, a list validator ``(2, "name")``)."""

    def __init__(self, subpath: Sequence[Any], message: str) -> None:
        super().__init__(message)
        self.subpath: NodePath = tuple(subpath)


@dataclass(frozen=True)
class Problem:
    """One validation error: its line (None when unknown), dotted field path and message."""

    line: int | None
    field: str
    message: str


@dataclass
class Located:
    """A parsed YAML document and the 1-based line of every node path in it."""

    data: Any
    lines: dict[NodePath, int] = field(default_factory=dict)

    def line_for(self, loc: Sequence[Any]) -> int | None:
        """The line of ``loc``, or of its nearest ancestor present in the document (a missing field)."""
        return line_for(self.lines, tuple(loc))

    def problems(self, exc: ValidationError) -> list[Problem]:
        """Each error of ``exc`` with its line and dotted field path (``(top level)`` for the root)."""
        out = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, FieldError):
                loc += cause.subpath
            out.append(Problem(self.line_for(loc), ".".join(str(p) for p in loc) or "(top level)", err["msg"]))
        return out


def index_lines(node: yaml.Node, path: NodePath, out: dict[NodePath, int]) -> None:
    """Record in ``out`` the 1-based line of ``node`` (at ``path``) and of everything under it."""
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            out[(*path, key.value)] = key.start_mark.line + 1
            index_lines(value, (*path, key.value), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            index_lines(item, (*path, i), out)


def line_for(lines: dict[NodePath, int], loc: NodePath) -> int | None:
    """The line of ``loc`` or of its nearest ancestor in ``lines``; None when not even the root is."""
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in lines:
            return lines[loc[:cut]]
    return None


def load_located(text: str) -> Located:
    """Parse ``text`` (safe loader) and index its lines; :class:`YAMLSyntaxError` when it is not YAML.

    An empty document gives ``data=None`` and no lines.
    """
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise YAMLSyntaxError(str(getattr(exc, "problem", exc)), mark.line + 1 if mark is not None else None) from None
    located = Located(data)
    if node is not None:
        index_lines(node, (), located.lines)
    return located
