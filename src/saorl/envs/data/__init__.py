"""Datasets on disk: rows of JSON lines, Parquet, `datasets` directories (`files.py`) and math
problem sets with field mappings and named presets (`datasets.py`)."""
