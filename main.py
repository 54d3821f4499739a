"""Entry point of every esync process: `python main.py [flags]` (same as `esync`).

Without DMLC_ROLE it trains standalone (`-m local`); see README.md for the flags.
"""
import sys

from esync.cli import console_main

if __name__ == "__main__":
    sys.exit(console_main())
