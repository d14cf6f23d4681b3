"""llama.cpp's slots: ``--parallel`` of them, each holding one task at a time, and the ``/slots`` body.

``server_context::get_available_slot`` picks an idle slot by prompt similarity, else the least recently
used one; a task that finds none is deferred. Here a sequence takes a slot when the serving model admits
it (the scheduler never runs more than ``--parallel`` sequences) and gives it back when it finishes.
``server_slot::to_json(only_metrics=true)`` (``LLAMA_SERVER_SLOTS_DEBUG`` unset) is the ``/slots`` entry:
``id``, ``n_ctx``, ``speculative``, ``is_processing`` and, once a slot has run a task, ``id_task``, the
prompt's ``n_prompt_tokens``, ``n_prompt_tokens_processed`` and ``n_prompt_tokens_cache``, ``params`` and
``next_token``. An idle slot keeps its last task's id, prompt length and parameters but shows its counters
reset (``n_decoded`` 0, ``n_remain`` -1), as the real b11312 build does
(``tests/fixtures/engines/llamacpp/b11312-cpu/raw/slots-fresh.json``, ``slots-after-load.json``; ggml-org/llama.cpp
0c1e57098bba43ac29e6e3b677cdceebdd22334f). ``/slots`` is on by default in that build (``--no-slots``).
``server_slot`` (``to_json``, ``release``, ``get_timings``) was read in ``tools/server/server-context.cpp``
at fb4026604c67c682f552337ec9b91eced0abd35a, an earlier tree: where the capture differs, the capture wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferwatch.simulator.engines.llamacpp.protocol import TaskParams
from inferwatch.simulator.scheduler import Sequence, StepReport


@dataclass
class Task:
    """What a slot remembers of its task (``task`` or ``task_prev``)."""

    id: int
    params: TaskParams


@dataclass
class Slot:
    id: int
    n_ctx: int
    seq: Sequence | None = None
    task: Task | None = None
    last_seq: Sequence | None = None
    t_last_used: float = -1.0

    @property
    def is_processing(self) -> bool:
        return self.seq is not None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "n_ctx": self.n_ctx,
            "speculative": False,
            "is_processing": self.is_processing,
        }
        seq = self.seq or self.last_seq
        if self.task is None or seq is None:
            return out
        out["id_task"] = self.task.id
        out["n_prompt_tokens"] = seq.prompt_tokens
        live = self.seq is not None
        out["n_prompt_tokens_processed"] = seq.prompt_tokens - seq.cached_tokens if live else 0
        out["n_prompt_tokens_cache"] = seq.cached_tokens if live else 0
        out["params"] = self.task.params.to_json(only_metrics=True)
        n_predict = self.task.params.n_predict
        out["next_token"] = [
            {
                "has_next_token": live and seq.finish is None,
                "has_new_line": False,
                "n_remain": n_predict - seq.generated if live and n_predict != -1 else -1,
                "n_decoded": seq.generated if live else 0,
            }
        ]
        return out


class Slots:
    """The slot table, kept in step with the serving model."""

    def __init__(self, n_slots: int, n_ctx: int) -> None:
        self.slots = [Slot(i, n_ctx) for i in range(n_slots)]
        self.tasks: dict[int, Task] = {}
        """id(sequence) -> its task, registered before the sequence is submitted."""
        self._by_seq: dict[int, Slot] = {}

    def register(self, seq: Sequence, task: Task) -> None:
        self.tasks[id(seq)] = task

    def slot_of(self, seq: Sequence) -> int:
        """``id_slot`` of a sequence's final result (-1 if it never held one)."""
        slot = self._by_seq.get(id(seq))
        return -1 if slot is None else slot.id

    def on_step(self, report: StepReport, now: float) -> None:
        for seq in report.admitted:
            self._acquire(seq)
        for seq in report.finished:
            self._release(seq, now)
        self.sweep(now)

    def sweep(self, now: float) -> None:
        """Free the slots of requests aborted between steps (their clients went away)."""
        for slot in self.slots:
            if slot.seq is not None and slot.seq.finish is not None:
                self._release(slot.seq, now)

    def _acquire(self, seq: Sequence) -> None:
        if id(seq) in self._by_seq:
            return
        idle = [s for s in self.slots if not s.is_processing]
        if not idle:
            return
        slot = min(idle, key=lambda s: s.t_last_used)  # least recently used
        slot.seq = seq
        slot.task = self.tasks.get(id(seq)) or Task(-1, TaskParams(stream=False))
        self._by_seq[id(seq)] = slot

    def _release(self, seq: Sequence, now: float) -> None:
        slot = self._by_seq.get(id(seq)) or next((s for s in self.slots if s.seq is seq), None)
        if self.tasks.pop(id(seq), None) is None:
            self._by_seq.pop(id(seq), None)  # the built-in load: nobody reads its id_slot
        if slot is None or slot.seq is not seq:
            return
        slot.seq = None
        slot.last_seq = seq
        slot.t_last_used = now

    def forget(self, seq: Sequence) -> None:
        """A request's result has been sent (or its client left): drop what was kept for its ``id_slot``."""
        self.tasks.pop(id(seq), None)
        self._by_seq.pop(id(seq), None)

    def to_json(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.slots]

    @property
    def idle(self) -> int:
        return sum(1 for s in self.slots if not s.is_processing)
