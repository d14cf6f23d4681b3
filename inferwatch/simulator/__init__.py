"""Simulated LLM engines (vLLM, TGI, trtllm-serve, Triton) for demos and tests; never needed in production."""
