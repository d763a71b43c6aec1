"""Math problems: answer extraction (`extract.py`), normalisation (`normalize.py`), the grader
(`grader.py`) and its worker process (`worker.py`), and math with a Python tool (`tool.py`)."""
