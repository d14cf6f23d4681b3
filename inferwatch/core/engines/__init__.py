"""What inferwatch knows about each engine outside its metrics: launch flags, tuning knobs, gaps.

One module per engine (:mod:`~inferwatch.core.engines.vllm`, ``tgi``, ``trtllm``, ``triton``), each
mostly data: the flags of its launch command with their defaults, the exact knob that carries out
each kind of remedy, and the canonical signals it cannot provide (with why). The diagnosis, the
tuning checklist, the alert runbooks and the exporters' coverage matrix read these profiles, so an
engine's operating knowledge is written once. :func:`builtin_profiles` builds the registry; nothing
is registered at import time.

Sources: the engines' own argument parsers (vLLM ``engine/arg_utils.py`` and ``config/*.py``,
0.11–0.33; TGI 3.3 ``launcher/src/main.rs``; TensorRT-LLM's ``trtllm-serve`` option reference and
``llmapi/llm_args.py``; the Triton TensorRT-LLM backend's ``model_instance_state.cc``).
"""

from __future__ import annotations

from inferwatch.core.engines import llamacpp, sglang, tgi, triton, trtllm, vllm
from inferwatch.core.engines.profile import EngineProfile


def builtin_profiles() -> dict[str, EngineProfile]:
    """The profiles of the engines inferwatch supports, by engine name (a new dict each call)."""
    return {
        p.name: p for p in (vllm.PROFILE, tgi.PROFILE, trtllm.PROFILE, triton.PROFILE, llamacpp.PROFILE, sglang.PROFILE)
    }
