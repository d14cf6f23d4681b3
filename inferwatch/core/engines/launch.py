"""Read an engine's launch command line the way the engine itself would.

``parse_launch("vllm serve meta-llama/Llama-3.1-8B --max-num-seqs 512", profiles)`` tells which
engine the line starts, the model, and for every knob the value in effect: the flag's (or the
environment variable's) when given, the engine's default otherwise. Container lines
(``docker run ... vllm/vllm-openai:latest --model ...``) and leading ``NAME=value`` assignments
count too; ``key=value`` words set config-file keys (trtllm-serve's YAML, Triton's config.pbtxt).
Errors name the flag and what was expected.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from inferwatch.core.engines.profile import EngineProfile, Flag, FlagKind, Knob

CONTAINER_RUNTIMES = ("docker", "podman", "nerdctl")
# docker run options that take a value (so the value is not mistaken for the image)
_CONTAINER_VALUE_OPTIONS = frozenset(
    {
        "-e", "--env", "-v", "--volume", "-p", "--publish", "--name", "--gpus", "--shm-size", "--ipc", "--network",
        "--net", "-w", "--workdir", "--entrypoint", "-u", "--user", "--runtime", "--env-file", "--mount", "-m",
        "--memory", "--cpus", "--device", "--label", "-l", "--restart", "--ulimit", "--hostname", "-h", "--platform",
    }
)  # fmt: skip
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class LaunchError(ValueError):
    """The launch line cannot be read; the message names the flag or the problem."""


@dataclass(frozen=True)
class Setting:
    """The value of one knob in effect for a launch line."""

    knob: Knob
    value: str | float | bool | dict[str, object] | None
    source: str
    """``--max-num-seqs``, ``env MAX_CONCURRENT_REQUESTS``, ``default`` or ``fixed``."""
    flag: Flag | None = None
    note: str = ""

    @property
    def explicit(self) -> bool:
        return self.source not in ("default", "fixed")


@dataclass(frozen=True)
class LaunchConfig:
    engine: str
    command: str
    model: str | None
    settings: Mapping[Knob, Setting]
    unknown: tuple[str, ...] = ()
    """flags the engine profile does not list (passed through, not judged)."""
    env: Mapping[str, str] = field(default_factory=dict)

    def get(self, knob: Knob) -> Setting | None:
        return self.settings.get(knob)

    def value(self, knob: Knob) -> str | float | bool | dict[str, object] | None:
        setting = self.settings.get(knob)
        return None if setting is None else setting.value


def _split(line: str) -> list[str]:
    try:
        return shlex.split(line.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise LaunchError(f"cannot split the command line: {exc}") from None


def _base(token: str) -> str:
    name = os.path.basename(token)
    if name.startswith("python"):
        return "python3" if name.startswith("python3") else "python"
    return name


def _leading_env(tokens: list[str]) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    i = 0
    if tokens[:1] == ["env"]:
        i = 1
    while i < len(tokens) and "=" in tokens[i] and not tokens[i].startswith("-"):
        name, _, value = tokens[i].partition("=")
        if not name.isidentifier():
            break
        env[name] = value
        i += 1
    return env, tokens[i:]


def _container(
    tokens: list[str], profiles: Mapping[str, EngineProfile]
) -> tuple[EngineProfile, list[str], dict[str, str]]:
    """``docker run [options] IMAGE [args]`` -> (profile of IMAGE, args, -e variables)."""
    env: dict[str, str] = {}
    i = 2 if len(tokens) > 1 and tokens[1] == "run" else 1
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("-"):
            name, eq, value = tok.partition("=")
            if not eq and name in _CONTAINER_VALUE_OPTIONS and i + 1 < len(tokens):
                value = tokens[i + 1]
                i += 1
            if name in ("-e", "--env") and "=" in value:
                k, _, v = value.partition("=")
                env[k] = v
            i += 1
            continue
        image = tok
        for profile in profiles.values():
            if any(marker in image for marker in profile.images):
                return profile, tokens[i + 1 :], env
        known = ", ".join(m for p in profiles.values() for m in p.images)
        raise LaunchError(f"container image {image!r} is not a known engine image ({known}); pass the engine")
    raise LaunchError("the container command names no image")


def _identify(
    tokens: list[str], profiles: Mapping[str, EngineProfile], engine: str | None
) -> tuple[EngineProfile, str, list[str], dict[str, str]]:
    if not tokens:
        raise LaunchError("the launch line is empty")
    if _base(tokens[0]) in CONTAINER_RUNTIMES:
        profile, args, env = _container(tokens, profiles)
        if engine is not None and engine != profile.name:
            raise LaunchError(f"the image runs {profile.name}, not {engine}")
        return profile, f"{tokens[0]} run {profile.images[0]}", args, env
    words = [_base(tokens[0]), *tokens[1:]]
    candidates = [profiles[engine]] if engine is not None else list(profiles.values())
    for profile in candidates:
        for command in sorted(profile.commands, key=len, reverse=True):
            if words[: len(command)] == list(command):
                return profile, " ".join(command), tokens[len(command) :], {}
    if engine is not None:
        # a wrapper the profile does not list (a script, an alias): read the flags anyway
        return profiles[engine], tokens[0], tokens[1:], {}
    known = "; ".join(" ".join(p.commands[0]) for p in profiles.values())
    raise LaunchError(f"cannot tell which engine {tokens[0]!r} starts (known: {known}); pass the engine")


def _convert(flag: Flag, spelled: str, raw: str) -> str | float | bool | dict[str, object]:
    kind = flag.kind
    try:
        if kind is FlagKind.INT:
            return float(int(raw, 10))
        if kind is FlagKind.FLOAT:
            return float(raw)
    except ValueError:
        what = "an integer" if kind is FlagKind.INT else "a number"
        raise LaunchError(f"{spelled}: expected {what}, got {raw!r}") from None
    if kind is FlagKind.BOOL:
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise LaunchError(f"{spelled}: expected true or false, got {raw!r}")
    if kind is FlagKind.JSON:
        try:
            parsed = json.loads(raw)
        except ValueError as exc:
            raise LaunchError(f"{spelled}: expected a JSON object: {exc}") from None
        if not isinstance(parsed, dict):
            raise LaunchError(f"{spelled}: expected a JSON object, got {raw!r}")
        return parsed
    if flag.choices and raw not in flag.choices:
        raise LaunchError(f"{spelled}: {raw!r} is not one of {', '.join(flag.choices)}")
    return raw


@dataclass
class _Args:
    """The words after the command, read left to right into knob settings, unknown flags and the model."""

    profile: EngineProfile
    args: list[str]
    by_name: dict[str, Flag] = field(default_factory=dict)
    negations: dict[str, Flag] = field(default_factory=dict)
    settings: dict[Knob, Setting] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)
    model: str | None = None
    i: int = 0

    def __post_init__(self) -> None:
        for flag in self.profile.flags:
            for name in flag.names:
                self.by_name[name] = flag
            for name in flag.negations:
                self.negations[name] = flag

    def read(self) -> None:
        while self.i < len(self.args):
            tok = self._take()
            if tok.startswith("-") and len(tok) > 1:
                self._flag(tok)
            else:
                self._word(tok)

    def _take(self) -> str:
        tok = self.args[self.i]
        self.i += 1
        return tok

    def _flag(self, tok: str) -> None:
        spelled, eq, inline = tok.partition("=")
        name = self.profile.flag_style(spelled)
        if name in self.negations:
            negated = self.negations[name]
            self.settings[negated.knob] = Setting(negated.knob, False, spelled, negated)
            return
        if name in self.profile.model_flags:
            if not eq and self.i < len(self.args):
                inline = self._take()
            self.model = inline or self.model
            return
        found = self.by_name.get(name)
        raw = inline if eq else self._value_after(found)
        if found is None:
            self.unknown.append(spelled)
            return
        if raw is None and found.kind is not FlagKind.BOOL:
            raise LaunchError(f"{spelled}: expected a value")
        value = True if raw is None else _convert(found, spelled, raw)
        self.settings[found.knob] = Setting(found.knob, value, spelled, found)

    def _value_after(self, found: Flag | None) -> str | None:
        """The next word as the flag's value, when the flag takes one (an unknown flag may) and it is no flag."""
        takes_value = found is None or found.kind is not FlagKind.BOOL
        if takes_value and self.i < len(self.args) and not self.args[self.i].startswith("-"):
            return self._take()
        return None

    def _word(self, tok: str) -> None:
        """``key=value`` sets a config-file key; the first bare word is the model."""
        key, eq, raw_value = tok.partition("=")
        if eq and key in self.by_name:
            keyed = self.by_name[key]
            self.settings[keyed.knob] = Setting(keyed.knob, _convert(keyed, key, raw_value), key, keyed)
        elif self.model is None and not eq:
            self.model = tok
        else:
            self.unknown.append(tok)


def _complete(profile: EngineProfile, settings: dict[Knob, Setting], env: Mapping[str, str]) -> None:
    """Knobs no flag set: from the environment, else the engine's default; then the fixed ones."""
    for flag in profile.flags:
        if flag.knob in settings or flag.env is None or flag.env not in env:
            continue
        settings[flag.knob] = Setting(flag.knob, _convert(flag, flag.env, env[flag.env]), f"env {flag.env}", flag)
    for flag in profile.flags:
        if flag.knob not in settings:
            settings[flag.knob] = Setting(flag.knob, flag.default, "default", flag, flag.default_note)
    for knob, why in profile.always_on.items():
        settings.setdefault(knob, Setting(knob, True, "fixed", None, why))
    for knob, why in profile.build_time.items():
        settings.setdefault(knob, Setting(knob, None, "fixed", None, why))


def parse_launch(line: str, profiles: Mapping[str, EngineProfile], engine: str | None = None) -> LaunchConfig:
    """The engine, model and knob settings of a launch command line (see the module docstring)."""
    if engine is not None and engine not in profiles:
        raise LaunchError(f"unknown engine {engine!r}; known: {', '.join(profiles)}")
    env, tokens = _leading_env(_split(line))
    profile, command, args, container_env = _identify(tokens, profiles, engine)
    env.update(container_env)
    reader = _Args(profile, args)
    reader.read()
    _complete(profile, reader.settings, env)
    return LaunchConfig(profile.name, command, reader.model, reader.settings, tuple(reader.unknown), env)
