"""TGI's ``router/src/validation.rs``: the checks of a request's parameters and lengths, in the router's
order and with its messages (a failed check raises ``ValueError``; the API answers 422 ``Input validation
error: <message>``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from inferwatch.simulator.base import count_tokens
from inferwatch.simulator.engines.tgi.protocol import (
    DEFAULT_GENERATION_LENGTH,
    MAX_BEST_OF,
    MAX_STOP_SEQUENCES,
    MAX_TOP_N_TOKENS,
    Params,
)

_REJECTED_PARAMETERS: tuple[tuple[str, float | None, Callable[[float], bool], str], ...] = (
    # (parameter, its value when unset (None: unset passes), when the router rejects it, its message), in its order
    ("temperature", 1.0, lambda v: v <= 0.0, "`temperature` must be strictly positive"),
    ("repetition_penalty", 1.0, lambda v: v <= 0.0, "`repetition_penalty` must be strictly positive"),
    ("frequency_penalty", 0.0, lambda v: not -2.0 <= v <= 2.0, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
    ("top_p", None, lambda v: not 0.0 < v < 1.0, "`top_p` must be > 0.0 and < 1.0"),
    ("typical_p", None, lambda v: not 0.0 < v < 1.0, "`typical_p` must be > 0.0 and < 1.0"),
    ("top_k", None, lambda v: v <= 0, "`top_k` must be strictly positive"),
)


def _check_best_of(p: Params) -> int:
    """``best_of`` (1 when unset) after the router's checks: sampling when above 1, at most ``MAX_BEST_OF``."""
    sampling = p.do_sample or any(v is not None for v in (p.temperature, p.top_k, p.top_p, p.typical_p))
    best_of = p.best_of if p.best_of is not None else 1
    if best_of > 1 and not sampling:
        raise ValueError("you must use sampling when `best_of` is > 1")
    if best_of == 0 or best_of > MAX_BEST_OF:
        raise ValueError(f"`best_of` must be > 0 and <= {MAX_BEST_OF}. Given: {best_of}")
    return best_of


@dataclass(frozen=True)
class Validation:
    """``Validation`` with the router's token limits (``max_input_tokens``, ``max_total_tokens``)."""

    max_input_tokens: int
    max_total_tokens: int

    def validate(self, inputs: str, p: Params) -> tuple[int, int]:
        """``Validation::validate``: (input_length, max_total_new_tokens), or a ValidationError message."""
        best_of = _check_best_of(p)
        for name, unset, rejected, message in _REJECTED_PARAMETERS:
            value = getattr(p, name)
            value = unset if value is None else value
            if value is not None and rejected(value):
                raise ValueError(message)
        if p.max_new_tokens == 0:
            raise ValueError("`max_new_tokens` must be strictly positive")
        if len(p.stop) > MAX_STOP_SEQUENCES:
            raise ValueError(f"`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {len(p.stop)}")
        if p.seed is not None and best_of > 1:
            raise ValueError("`seed` must not be set when `best_of` > 1")
        if p.top_n_tokens is not None and p.top_n_tokens > MAX_TOP_N_TOKENS:
            raise ValueError(f"`top_n_tokens` must be >= 0 and <= {MAX_TOP_N_TOKENS}. Given: {p.top_n_tokens}")
        if not inputs:
            raise ValueError("`inputs` cannot be empty")
        if p.truncate is not None and (p.truncate == 0 or p.truncate > self.max_input_tokens):
            raise ValueError(
                f"`truncate` must be strictly positive and less than {self.max_input_tokens}. Given: {p.truncate}"
            )
        tokens = count_tokens(inputs)
        input_length = min(tokens, p.truncate) if p.truncate is not None else tokens
        return self.check_lengths(input_length, p.max_new_tokens)

    def check_lengths(self, input_length: int, max_new_tokens: int | None) -> tuple[int, int]:
        if max_new_tokens is not None:
            chunk, total_new = min(max_new_tokens, DEFAULT_GENERATION_LENGTH), max_new_tokens
        else:
            total_new = max(0, self.max_total_tokens - input_length)
            chunk = min(total_new, DEFAULT_GENERATION_LENGTH)
        if input_length + chunk > self.max_total_tokens:
            raise ValueError(
                f"`inputs` tokens + `max_new_tokens` must be <= {self.max_total_tokens}. "
                f"Given: {input_length} `inputs` tokens and {chunk} `max_new_tokens`"
            )
        if input_length > self.max_input_tokens:
            raise ValueError(f"`inputs` must have less than {self.max_input_tokens} tokens. Given: {input_length}")
        return input_length, total_new
