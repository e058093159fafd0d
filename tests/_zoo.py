"""The zoo as test parameters: the largest models carry the ``slow`` marker (``-m "not slow"``
skips them for a quick run; CI runs everything)."""

from __future__ import annotations

from typing import Any

import pytest

from opsched.models import list_models

#: The zoo models whose every-scheduler runs take seconds each on two cores.
LARGE = frozenset({"randwire_large", "nasnet_large"})


def zoo_params() -> list[Any]:
    return [pytest.param(name, marks=pytest.mark.slow, id=name) if name in LARGE else name for name in list_models()]
