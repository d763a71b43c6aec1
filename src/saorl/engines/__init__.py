"""Rollout engines, token in and token out: the interface (`protocol.py`), the in-process
HuggingFace engine (`hf.py`, with its KV slots and prefill plans), vLLM (`vllm.py` and its MoE,
LoRA and output helpers), the request bookkeeping both share (`requests.py`), and `factory.py`,
which builds the one `rollout.engine` names.
"""
