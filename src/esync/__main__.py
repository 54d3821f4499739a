"""`python -m esync`: the same as `python main.py` and the `esync` command."""
import sys

from esync.cli import console_main

sys.exit(console_main(prog="esync"))
