"""Immutable value types for the hook's modules, as named tuples are but without ``collections``.

Importing ``collections`` (for ``namedtuple``) and building the classes cost
each limited container's prestart about 2 ms, and the hook imports these types
on every container start that carries limits. A subclass names its fields, in
order, in ``_fields`` and makes them its ``__slots__``, may give defaults for
the last ones in ``_defaults`` (a tuple, as namedtuple's ``defaults``), and
annotates each field for the type checker::

    class Gpu(Record):
        _fields = ("uuid", "index", "memory")
        __slots__ = _fields
        uuid: str
        index: int
        memory: int

Instances are built from positional or keyword arguments, compare equal when
their type and fields are equal, hash, print, and give ``_asdict()`` as named
tuples do; setting a field raises AttributeError.
"""

from __future__ import annotations


class Record:
    """Base of the value types; see the module's docstring for ``_fields`` and ``_defaults``."""

    _fields: tuple[str, ...] = ()
    __slots__ = _fields
    _defaults: tuple = ()

    def __init__(self, *args: object, **kwargs: object) -> None:
        fields = self._fields
        if len(args) == len(fields) and not kwargs:  # the common case, without the checks
            for name, value in zip(fields, args):
                object.__setattr__(self, name, value)
            return
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__} takes {len(fields)} fields, got {len(args)}")
        values = dict(zip(fields[len(fields) - len(self._defaults) :], self._defaults))
        values.update(zip(fields, args))
        for name, value in kwargs.items():
            if name not in fields or name in fields[: len(args)]:
                raise TypeError(f"{type(self).__name__}: unexpected or repeated field {name!r}")
            values[name] = value
        for name in fields:
            if name not in values:
                raise TypeError(f"{type(self).__name__}: missing field {name!r}")
            object.__setattr__(self, name, values[name])

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self._fields)

    def _asdict(self) -> dict[str, object]:
        """The fields by name, in order."""
        return dict(zip(self._fields, self._values()))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self), self._values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in self._asdict().items())
        return f"{type(self).__name__}({fields})"
