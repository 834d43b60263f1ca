"""moto finds the method of each request's action by listing its response class's functions with
`inspect.getmembers`, at every request: about a millisecond for EC2's class of several hundred methods, on every call
the twin's runs make. A class's functions do not change while the process runs, so the list is made once per class;
which method answers, and how, is unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

import moto.core.responses
from moto.core.utils import method_names_from_class

_PATCHED = "_lustrain_twin_cached"


def install() -> None:
    responses: Any = moto.core.responses
    if getattr(responses.method_names_from_class, _PATCHED, False):
        return
    cached = functools.cache(method_names_from_class)
    setattr(cached, _PATCHED, True)
    responses.method_names_from_class = cached
