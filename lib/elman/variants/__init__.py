"""The E-series variants, one module each (`e<number>.py`, or `e<number><suffix>.py` where one
number has variants of two kernel families, e.g. e67lr.py); `elman.registry` collects their
`ENTRIES` in the order of the variant numbers. A new module here is found without a list."""
from __future__ import annotations

import importlib
import pkgutil
import re

_NAME = re.compile(r"e(\d+)([a-z]*)")


def _key(name: str) -> tuple[int, str]:
    number, suffix = _NAME.fullmatch(name).groups()
    return int(number), suffix


MODULES = tuple(importlib.import_module(f"{__name__}.{name}")
                for name in sorted((m.name for m in pkgutil.iter_modules(__path__) if _NAME.fullmatch(m.name)),
                                   key=_key))
