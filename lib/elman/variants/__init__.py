"""The E-series variants, one module each (`e<number>.py`); `elman.registry` collects their
`ENTRIES` in the order of the variant numbers. A new module here is found without a list."""
from __future__ import annotations

import importlib
import pkgutil
import re


def _number(name: str) -> int:
    return int(re.fullmatch(r"e(\d+)", name).group(1))


MODULES = tuple(importlib.import_module(f"{__name__}.{m.name}")
                for m in sorted((m for m in pkgutil.iter_modules(__path__) if re.fullmatch(r"e\d+", m.name)),
                                key=lambda m: _number(m.name)))
