"""The project's scripts outside the package (benchmarks/, docs/) as modules the tests can call: each
loaded from its file under its own name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path) -> ModuleType:
    """The script at `path` run as a module named after its file, and registered in sys.modules under
    that name (dataclasses look their module up while a class is made)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
