"""The globals a pickle names, read from its opcodes without unpickling anything.

Unpickling runs code only through globals: every callable a pickle can call (REDUCE, NEWOBJ, BUILD's
`__setstate__`) is a class or function it first looked up by module and name. Listing those names
from the opcodes, before any unpickler sees the bytes, lets a caller refuse a pickle whatever
unpickler will load it afterwards.

The scan is deliberately strict: a name it cannot read off the opcodes for certain (a STACK_GLOBAL
whose operands are not the two strings pushed just before it, an extension-registry opcode) is
refused rather than guessed, and so is any byte sequence pickletools cannot decode. Python's own
pickler never produces those shapes, so an honest pickle is never refused for them.
"""

from __future__ import annotations

import pickletools
from dataclasses import dataclass
from typing import Any, BinaryIO

# Opcodes that push one str (protocol 0-2 strings decode to str under torch.load and pickle.load alike)
_STRING_OPS = frozenset(
    {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
)
_MEMO_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_MEMO_PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_NAMED_GLOBAL_OPS = frozenset({"GLOBAL", "INST"})  # module and name are the opcode's own argument
_EXTENSION_OPS = frozenset({"EXT1", "EXT2", "EXT4"})  # copyreg's extension registry: a global by number


@dataclass(frozen=True)
class PickleGlobal:
    """A global a pickle looks up (`module`, `name`), and where."""

    module: str
    name: str
    position: int

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.name}"


class UnreadablePickle(ValueError):
    """The pickle's opcodes cannot be decoded, or name a global the scan cannot read for certain."""


def pickle_globals(data: bytes | BinaryIO) -> list[PickleGlobal]:
    """Every global the pickle in `data` (up to its STOP) names, in order. A stream is left just past the
    STOP, where an unpickler reading it would leave it (a file may hold several pickles in a row).

    Raises:
        UnreadablePickle: the opcodes do not decode, or a global's name is not a literal.
    """
    found: list[PickleGlobal] = []
    memo: dict[int, str | None] = {}  # str values the memo holds (None: something else)
    pushed: list[str | None] = []  # what the opcodes since the last other opcode pushed, top last
    arg: Any  # each opcode's argument: its type depends on the opcode
    try:
        for opcode, arg, pos in pickletools.genops(data):
            name = opcode.name
            if name in _STRING_OPS:
                pushed.append(arg if isinstance(arg, str) else arg.decode("latin-1"))
                continue
            if name in _MEMO_GET_OPS:
                pushed.append(memo.get(arg))
                continue
            if name == "MEMOIZE":  # memo[len(memo)] = top of stack, as the unpickler does
                memo[len(memo)] = pushed[-1] if pushed else None
                continue
            if name in _MEMO_PUT_OPS:
                memo[arg] = pushed[-1] if pushed else None
                continue
            if name == "FRAME":  # framing only; the stack is untouched
                continue
            if name in _NAMED_GLOBAL_OPS:
                module, _, qualname = str(arg).partition(" ")
                found.append(PickleGlobal(module, qualname, pos or 0))
            elif name == "STACK_GLOBAL":
                if len(pushed) < 2 or pushed[-1] is None or pushed[-2] is None:
                    raise UnreadablePickle(f"a STACK_GLOBAL at byte {pos} whose module and name are not literals")
                found.append(PickleGlobal(pushed[-2], pushed[-1], pos or 0))
            elif name in _EXTENSION_OPS:
                raise UnreadablePickle(f"{name} at byte {pos} names a global through copyreg's extension registry")
            pushed = []  # any other opcode may have changed the top of the stack
    except UnreadablePickle:
        raise
    except Exception as exc:  # pickletools raises ValueError and others on bad input
        raise UnreadablePickle(f"not a readable pickle: {exc}") from exc
    return found
