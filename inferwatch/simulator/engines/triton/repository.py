"""The model repository: the TensorRT-LLM backend's ``inflight_batcher_llm`` ensemble, its models and
their tensors as the generate extension and the model metadata show them (all version ``1``)."""

from __future__ import annotations

MODEL_VERSION = "1"

ENSEMBLE = "ensemble"
PREPROCESSING = "preprocessing"
TENSORRT_LLM = "tensorrt_llm"
POSTPROCESSING = "postprocessing"
MODELS = (ENSEMBLE, TENSORRT_LLM, POSTPROCESSING, PREPROCESSING)
"""The repository's models, in the fixture's series order."""
DECOUPLED = (ENSEMBLE, TENSORRT_LLM)
"""Models with the first-response histogram (core r25.03 creates it for decoupled models only)."""


# -- the ensemble's models as the generate extension sees them --------------------------------------
Tensor = tuple[str, str, list[int]]
ENSEMBLE_INPUTS: tuple[Tensor, ...] = (
    ("text_input", "BYTES", [-1, 1]),
    ("decoder_text_input", "BYTES", [-1, 1]),
    ("max_tokens", "INT32", [-1, 1]),
    ("bad_words", "BYTES", [-1, -1]),
    ("stop_words", "BYTES", [-1, -1]),
    ("exclude_input_in_output", "BOOL", [-1, 1]),
    ("end_id", "INT32", [-1, 1]),
    ("pad_id", "INT32", [-1, 1]),
    ("top_k", "INT32", [-1, 1]),
    ("top_p", "FP32", [-1, 1]),
    ("temperature", "FP32", [-1, 1]),
    ("length_penalty", "FP32", [-1, 1]),
    ("repetition_penalty", "FP32", [-1, 1]),
    ("min_tokens", "INT32", [-1, 1]),
    ("presence_penalty", "FP32", [-1, 1]),
    ("frequency_penalty", "FP32", [-1, 1]),
    ("seed", "UINT64", [-1, 1]),
    ("return_log_probs", "BOOL", [-1, 1]),
    ("return_context_logits", "BOOL", [-1, 1]),
    ("return_generation_logits", "BOOL", [-1, 1]),
    ("beam_width", "INT32", [-1, 1]),
    ("stream", "BOOL", [-1, 1]),
    ("prompt_embedding_table", "FP16", [-1, -1, -1]),
    ("prompt_vocab_size", "INT32", [-1, 1]),
    ("embedding_bias_words", "BYTES", [-1, -1]),
    ("embedding_bias_weights", "FP32", [-1, -1]),
)
ENSEMBLE_REQUIRED = ("text_input", "max_tokens")
ENSEMBLE_OUTPUTS: tuple[Tensor, ...] = (
    ("text_output", "BYTES", [-1, -1]),
    ("cum_log_probs", "FP32", [-1, -1]),
    ("output_log_probs", "FP32", [-1, -1, -1]),
    ("context_logits", "FP32", [-1, -1, -1]),
    ("generation_logits", "FP32", [-1, -1, -1, -1]),
    ("batch_index", "INT32", [-1, 1]),
    ("sequence_index", "INT32", [-1, 1]),
)
MODEL_TENSORS: dict[str, tuple[str, tuple[Tensor, ...], tuple[Tensor, ...]]] = {
    ENSEMBLE: ("ensemble", ENSEMBLE_INPUTS, ENSEMBLE_OUTPUTS),
    PREPROCESSING: (
        "python",
        (
            ("QUERY", "BYTES", [-1, 1]),
            ("DECODER_QUERY", "BYTES", [-1, 1]),
            ("REQUEST_OUTPUT_LEN", "INT32", [-1, 1]),
            ("BAD_WORDS_DICT", "BYTES", [-1, -1]),
            ("STOP_WORDS_DICT", "BYTES", [-1, -1]),
            ("END_ID", "INT32", [-1, 1]),
            ("PAD_ID", "INT32", [-1, 1]),
        ),
        (
            ("INPUT_ID", "INT32", [-1, -1]),
            ("REQUEST_INPUT_LEN", "INT32", [-1, 1]),
            ("REQUEST_OUTPUT_LEN", "INT32", [-1, -1]),
            ("BAD_WORDS_IDS", "INT32", [-1, 2, -1]),
            ("STOP_WORDS_IDS", "INT32", [-1, 2, -1]),
            ("OUT_END_ID", "INT32", [-1, 1]),
            ("OUT_PAD_ID", "INT32", [-1, 1]),
        ),
    ),
    TENSORRT_LLM: (
        "tensorrtllm",
        (
            ("input_ids", "INT32", [-1, -1]),
            ("input_lengths", "INT32", [-1, 1]),
            ("request_output_len", "INT32", [-1, 1]),
            ("end_id", "INT32", [-1, 1]),
            ("pad_id", "INT32", [-1, 1]),
            ("streaming", "BOOL", [-1, 1]),
            ("beam_width", "INT32", [-1, 1]),
            ("min_tokens", "INT32", [-1, 1]),
        ),
        (
            ("output_ids", "INT32", [-1, -1, -1]),
            ("sequence_length", "INT32", [-1, -1]),
            ("cum_log_probs", "FP32", [-1, -1]),
            ("output_log_probs", "FP32", [-1, -1, -1]),
            ("context_logits", "FP32", [-1, -1, -1]),
            ("generation_logits", "FP32", [-1, -1, -1, -1]),
            ("batch_index", "INT32", [-1, 1]),
            ("sequence_index", "INT32", [-1, 1]),
        ),
    ),
    POSTPROCESSING: (
        "python",
        (
            ("TOKENS_BATCH", "INT32", [-1, -1, -1]),
            ("SEQUENCE_LENGTH", "INT32", [-1, -1]),
            ("CUM_LOG_PROBS", "FP32", [-1, -1]),
            ("OUTPUT_LOG_PROBS", "FP32", [-1, -1, -1]),
        ),
        (("OUTPUT", "BYTES", [-1, -1]), ("OUT_CUM_LOG_PROBS", "FP32", [-1, -1])),
    ),
}
