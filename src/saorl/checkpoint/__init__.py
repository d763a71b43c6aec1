"""Checkpoints: atomic, weights-only, digest-checked files (`io.py`, `digest.py`) and sharded
ones (`dcp.py` writes and reads them across ranks, `shards.py` reads one in a process).
"""
