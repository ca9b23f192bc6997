"""The compiled codec's modules for the tests that compare them with their pure-Python references.

The modules are imported directly, not through mqstore.codec's choice, so those tests also run under
``MQSTORE_PURE_PYTHON=1`` (make test runs ``-m codec`` so). A module that is not built fails the test
module with the reason: a comparison that cannot run must not pass as skipped.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings


def module(name: str) -> ModuleType:
    """``mqstore.codec.<name>`` (``_scan``, ``_stamp`` ...)."""
    try:
        return importlib.import_module(f"mqstore.codec.{name}")
    except ImportError as exc:
        pytest.fail(f"the compiled codec is not built ({exc}): run make setup with a C compiler", pytrace=False)


def examples(count: int) -> settings:
    """Hypothesis settings of a comparison: ``count`` examples, no deadline (the machine is shared)."""
    return settings(max_examples=count, deadline=None, suppress_health_check=[HealthCheck.too_slow])
