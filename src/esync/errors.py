"""The one exception type that reaches the user as a single line and exit code 2."""


class UserError(Exception):
    """Bad input from the user (a flag, a file, an environment variable).

    The message names what was wrong and what was expected; `esync.cli` prints it as
    one line and exits with status 2, without a traceback.
    """
