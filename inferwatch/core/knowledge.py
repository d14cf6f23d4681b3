"""The operating knowledge inferwatch was founded on, in the forms the generators print it.

The symptom catalogue (:mod:`inferwatch.core.symptoms`) and the tuning checklist
(:mod:`inferwatch.core.checklist`) are the source; the alert runbooks, the dashboards' operating
notes and the diagnosis all read them, so none spells the knowledge itself.
"""

from __future__ import annotations

from typing import Final

from inferwatch.core.causes import CAUSES, remedies
from inferwatch.core.checklist import CHECKLIST
from inferwatch.core.symptoms import CATALOGUE

KV_CACHE_FORMULA: Final = "2 × layers × KV heads × head dim × sequence length × batch × bytes per element"
"""Bytes of KV cache a batch needs (the factor 2: one key and one value vector per token)."""


def symptom_table() -> tuple[tuple[str, str, str], ...]:
    """(symptom, likely cause, remedies) rows, in the catalogue's order."""
    return tuple((spec.title, spec.cause, "; ".join(r.text for r in spec.remedies)) for spec in CATALOGUE)


def tuning_checklist() -> tuple[str, ...]:
    """The checklist questions."""
    return tuple(check.question for check in CHECKLIST)


def cause_table() -> tuple[tuple[str, str, str, str, str], ...]:
    """(symptom id, likely cause id, what the GPU shows, cause, remedies) rows: the causes the GPU tells
    apart (:mod:`inferwatch.core.causes`), in the order the diagnosis tries them."""
    return tuple(
        (c.symptom.value, c.id.value, c.condition, c.cause, "; ".join(r.text for r in remedies(c))) for c in CAUSES
    )
