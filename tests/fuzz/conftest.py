"""Make the `fuzz` package (this folder) importable: pytest runs with --import-mode=importlib,
which does not put test folders on sys.path."""
import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
