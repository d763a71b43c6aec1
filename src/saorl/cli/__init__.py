"""The `saorl` command: its parser (`parser.py`) and what each subcommand does (`main.py`)."""
