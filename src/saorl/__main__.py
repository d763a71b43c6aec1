"""`python -m saorl ...` is the `saorl` console script."""

from saorl.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
