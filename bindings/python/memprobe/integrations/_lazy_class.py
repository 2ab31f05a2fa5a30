"""A callback class made on first use: the framework's base class is
imported only when a user asks for the callback, so importing an
integration module never imports its framework."""

from __future__ import annotations

from typing import Any, Callable, List


class LazyClass:
    """``name``, a class deriving from ``hooks`` and the class ``base()``
    returns, made once, on the first :meth:`get` (a module's
    ``__getattr__`` hands its names to it)."""

    def __init__(self, module: str, name: str, hooks: type, base: Callable[[], type], doc: str) -> None:
        self._module = module
        self._name = name
        self._hooks = hooks
        self._base = base
        self._doc = doc
        self._made: List[type] = []

    def get(self, name: str) -> Any:
        if name != self._name:
            raise AttributeError(f"module {self._module!r} has no attribute {name!r}")
        if not self._made:
            self._made.append(
                type(self._name, (self._hooks, self._base()), {"__doc__": self._doc, "__module__": self._module})
            )
        return self._made[0]
