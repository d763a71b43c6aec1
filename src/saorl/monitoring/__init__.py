"""What a run shows while it runs: the metrics log (`metrics.py`), experiment trackers
(`tracking.py`), sample dumps (`samples.py`), live collapse detection (`collapse.py`), and text
made safe to print (`terminal.py`)."""
