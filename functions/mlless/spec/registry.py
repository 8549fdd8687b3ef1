"""Extension points by name: model types, sync protocols, aggregation rules, exchange patterns, function backends.

Each kind of extension is one `Registry`, tied to the spec field whose value names one of them. Registering an
extension (a built-in or a plugin's: `mlless.plugins`) also admits its name to that field in this process's
manifest validation (`schema.manifest_schema` reads `REGISTRIES`), so a job can ask for it; the CRD, generated from
the schema alone, lists only the built-in names.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """The extensions of one kind, by name: `register` adds one (a class decorator too), `named` finds one."""

    def __init__(self, kind: str, field: str | None, name_of: Callable[[T], str] = attrgetter("name")) -> None:
        """`kind` names the extensions in errors ("sync protocol"); `field` is the dotted spec field that selects
        one ("sync.protocol"), None when another registry admits the names (a model type's, for its model);
        `name_of` reads an extension's name."""
        self.kind = kind
        self._name_of = name_of
        self._items: dict[str, T] = {}
        if field is not None:
            REGISTRIES[field] = self

    def register(self, item: T) -> T:
        """Make `item` the extension of its name, replacing one registered before under it."""
        self._items[self._name_of(item)] = item
        return item

    def unregister(self, name: str) -> None:
        """Forget the extension registered as `name` (a test's, once it is done with it)."""
        del self._items[name]

    def named(self, name: str) -> T:
        """The extension registered as `name`; ValueError naming the known ones otherwise."""
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(f"no {self.kind} is registered as {name!r} (known: {', '.join(self._items)})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def values(self) -> list[T]:
        return list(self._items.values())


#: Every registry by the spec field that names its extensions.
REGISTRIES: dict[str, Registry] = {}  # type: ignore[type-arg]
