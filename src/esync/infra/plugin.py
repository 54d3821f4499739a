"""Plug-ins named `module:function`, the form of setuptools' entry points and Flower's
apps: `-n mypackage.nets:build` trains the network that `build()` in
`mypackage/nets.py` returns.

The module is imported as `python -m` would find it: from the Python path, or from the
current folder (put first on the path, as `python -m` and uvicorn do), so that a
`nets.py` beside the command works in every process a launcher starts there. Every
failure is one line naming the flag and what was wrong (a UserError).

    >>> build = load("mypackage.nets:build", "-n/--network")
    >>> model = build()

Importing this module is cheap (no torch): the parser checks a plug-in's form with
`is_spec`, and only a process that uses a plug-in imports it.
"""
from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from typing import Any, Callable

from esync.errors import UserError

_IDENTIFIER = r"[A-Za-z_]\w*"
_SPEC = re.compile(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}(\.{_IDENTIFIER})*")


def describe(error: BaseException) -> str:
    """`Type: message` on one line (the first of a message that has several)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def is_spec(text: str) -> bool:
    """Whether `text` has the form `module:function` (dotted names on both sides)."""
    return _SPEC.fullmatch(text) is not None


def load(spec: str, flag: str) -> Callable[..., Any]:
    """The function `spec` (`module:function`) names; UserError (one line naming `flag`)
    if its module cannot be imported, lacks the function, or it is not callable."""
    if not is_spec(spec):
        raise UserError(f"{flag} {spec}: expected module:function (e.g. mypackage.nets:build)")
    module_name, _, attribute = spec.partition(":")
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise UserError(f"{flag} {spec}: no module named {e.name!r} on the Python path "
                            f"or in {here}") from None
        raise UserError(f"{flag} {spec}: importing {module_name} failed: "
                        f"{describe(e)}") from None
    except Exception as e:  # the user's module raised while it was imported
        raise UserError(f"{flag} {spec}: importing {module_name} failed: "
                        f"{describe(e)}") from None
    found: Any = module
    for name in attribute.split("."):
        if not hasattr(found, name):
            raise UserError(f"{flag} {spec}: {module_name} has no {attribute!r}")
        found = getattr(found, name)
    if not callable(found):
        raise UserError(f"{flag} {spec}: {attribute} is a {type(found).__name__}, "
                        f"not a function")
    return found


def takes(spec: str, flag: str, parameter: str) -> bool:
    """Whether the function `spec` names has a parameter called `parameter`."""
    try:
        return parameter in inspect.signature(load(spec, flag)).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin)
        return False


def call(spec: str, flag: str, *args: Any, **kwargs: Any) -> Any:
    """Load `spec` and call it; an exception it raises is one line naming `flag`."""
    return invoke(load(spec, flag), spec, flag, *args, **kwargs)


def invoke(function: Callable[..., Any], spec: str, flag: str, *args: Any,
           **kwargs: Any) -> Any:
    """Call `function`, loaded from `spec` already (a plug-in called more than once, as
    --evaluate's is); an exception it raises is one line naming `flag`."""
    try:
        return function(*args, **kwargs)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"{flag} {spec}: calling it raised {describe(e)}") from None
