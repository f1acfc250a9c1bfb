"""The one list of every variant and baseline.

Tests, `elman parity`, `elman bench`, the LM wrapper, `elman dims` and the book all read
this registry. Each module of `elman.variants` and `elman.baselines` declares its
`ENTRIES`; this module collects them, in the order the packages list their modules.
Level names are case-insensitive (`E1`, `e1`, `1` all resolve).
"""
from __future__ import annotations

from . import baselines as _baselines
from . import variants as _variants
from .core.entry import Entry, ParityCase, Shape, Tolerance, shapes  # noqa: F401 (re-exported)

_REGISTRY: dict[str, Entry] = {}
_ALIASES: dict[str, str] = {}


def _add(entry: Entry) -> None:
    key = entry.name.lower()
    if key in _REGISTRY:
        raise ValueError(f"level {entry.name!r} is registered twice")
    _REGISTRY[key] = entry
    for alias in (entry.name, *entry.aliases):
        a = alias.lower()
        if _ALIASES.get(a, key) != key:
            raise ValueError(f"alias {alias!r} is taken by {_ALIASES[a]!r}")
        _ALIASES[a] = key


for _module in (*_variants.MODULES, *_baselines.MODULES):
    for _entry in _module.ENTRIES:
        _add(_entry)


def get(level: str | int) -> Entry:
    """The entry for a level name or alias (`"E1"`, `"1"`, `1`, `"mamba2"`; a numeric alias also
    with an E in front, `"E37v2"`), or a pattern name that a variant module's `entry_for` builds
    (`"E88h6n48"`)."""
    text = str(level).lower()
    key = _ALIASES.get(text)
    if key is None and text[:1] == "e" and text[1:2].isdigit():
        key = _ALIASES.get(text[1:])
    if key is None:  # a pattern name a variant module builds on demand (E88h{H}n{N}, E75h{H}n{N})
        for module in _variants.MODULES:
            build = getattr(module, "entry_for", None)
            if build is not None and (entry := build(str(level))) is not None:
                return entry
        known = ", ".join(e.name for e in entries())
        raise KeyError(f"unknown level {level!r}; registered levels: {known}")
    return _REGISTRY[key]


def entries(kind: str | None = None, family: str | None = None) -> list[Entry]:
    """All entries in registration order, optionally of one kind or kernel family."""
    return [e for e in _REGISTRY.values()
            if (kind is None or e.kind == kind) and (family is None or e.family == family)]


def variants() -> list[Entry]:
    return entries("variant")


def baselines() -> list[Entry]:
    return entries("baseline")
