"""What keeps untrusted input from running or writing where it should not: the trust gate of a
run folder's config (`trust.py`), every file write (`safe_io.py`: no links followed, private
modes, atomic) and every child interpreter (`child_python.py`: isolated mode).
"""
