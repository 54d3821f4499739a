"""Entry point of every esync process in a checkout: `python main.py [flags]` (the same as
the `esync` command, or `python -m esync`).

Without DMLC_ROLE it trains standalone (`-m local`); see README.md for the flags. It runs
this checkout's package (src/esync), installed or not; it is not installed itself, so
that no top-level module of esync's can shadow, or be shadowed by, a user's `main.py`.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))

from esync.cli import console_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(console_main())
