"""The run's own pieces around the loop: its folder's lock (`lock.py`), SIGTERM/SIGINT
handling (`signals.py`) and the checks of a plan before step 1 (`plan.py`).
"""
