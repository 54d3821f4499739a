"""The one way a message loop picks a message's handler: a table {type: handler} built
once, whose keys are also the only types the loop accepts.

`decode` refuses any other type (MessageError: "unknown message type ..."), so an
unknown type is handled in one place, the loop's own `except MessageError` that logs the
message and answers `error`: a hostile or malformed message never ends a process, and no
type can reach a handler that was not listed."""
from __future__ import annotations

from typing import Any, Callable, Dict, Generic, Mapping, Sequence, Tuple, TypeVar

from esync.transport.message import Message, MessageError, decode

R = TypeVar("R")


class Handlers(Generic[R]):
    """A loop's handlers by message type; each is called with the loop's own arguments
    followed by the message."""

    def __init__(self, table: Mapping[str, Callable[..., R]]):
        self._table: Dict[str, Callable[..., R]] = dict(table)

    @property
    def types(self) -> Tuple[str, ...]:
        """The message types this loop accepts, in the table's order."""
        return tuple(self._table)

    def decode(self, frames: Sequence[Any]) -> Message:
        """Parse and check a received message (identity frames removed) of a listed type."""
        return decode(frames, self.types)

    def __call__(self, msg: Message, *args: Any) -> R:
        """Run `msg`'s handler with `args` and `msg`; its result is the loop's to use."""
        handler = self._table.get(msg.type)
        if handler is None:  # a message decoded for another loop's types
            raise MessageError(f"unknown message type {msg.type[:40]!r}")
        return handler(*args, msg)
