#!/usr/bin/env python
"""The ESync state server's Django command line (`python manage.py runserver 0.0.0.0:10010`)."""
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stateserver.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
