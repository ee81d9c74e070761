"""Test session set-up: 8 CPU devices before anything touches JAX (as in the chapters)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tools/ is importable from the tests

from beyondgrad import runtime  # noqa: E402

runtime.ensure_cpu_devices(runtime.BOOK_DEVICE_COUNT)
