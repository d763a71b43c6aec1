"""Checkpoints: atomic, weights-only, digest-checked files (`checkpoint.py`, `digest.py`) and
sharded ones (`dcp.py` writes and reads them across ranks, `shards.py` reads one in a process).

`saorl.checkpoint.save_checkpoint` (and every other name of `checkpoint.py`) still reads from here.
"""

from saorl._moved import forward

__getattr__, __dir__ = forward(__name__)
