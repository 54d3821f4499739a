"""The log tools (esync-summary, esync-draw, esync-compare): iteration logs to summaries,
figures and tables. Loaded, they import only the registry of esync (no torch, nothing of
the runtime); esync.errors, the one error type and the commands' frame, only when they
raise it or run as a command."""


def user_error(message: str) -> Exception:
    """esync.errors.UserError(message): bad input, one line for the user."""
    from esync.errors import UserError

    return UserError(message)


def error_type(module: str, name: str, alias: str) -> type:
    """For a module's `__getattr__`: esync.errors.UserError under its old `alias`."""
    if name != alias:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    from esync.errors import UserError

    return UserError
