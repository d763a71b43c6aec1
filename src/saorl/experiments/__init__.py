"""`saorl compare` (`compare.py`: arms x seeds, `arms.py`: what an arm is, `compare_report.py`:
the comparison report) and the plots of one run (`report.py`)."""
