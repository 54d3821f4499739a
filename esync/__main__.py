"""`python -m esync`: the same as `python main.py` and the `esync` command."""
import sys

from esync.cli import main

sys.exit(main(prog="esync"))
