"""Held-out evaluation (`held_out.py`: `saorl eval` and evaluation during training), the
prompt templates of published math results (`prompts.py`) and the OpenAI-compatible client that
evaluates a model behind a server (`openai_client.py`).
"""
