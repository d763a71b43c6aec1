"""Held-out evaluation (`evaluation.py`: `saorl eval` and evaluation during training) and the
prompt templates of published math results (`prompts.py`).

`saorl.evaluation.run_eval` (and every other name of `evaluation.py`) still reads from here.
"""

from saorl._moved import forward

__getattr__, __dir__ = forward(__name__)
