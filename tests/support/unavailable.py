"""What a test does when something it drives (a stock client, another Spark) cannot be had
here: fail under CI, else say why on stderr and skip -- never silently."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import pytest


def unavailable(message: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(message)
    print(message, file=sys.stderr)
    pytest.skip(message)
