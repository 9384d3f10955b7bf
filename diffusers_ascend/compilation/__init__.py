"""The torch.compile backend (`AscendBackend`), its fusion passes and `FusionReport`.

Importing this package is cheap: Inductor is imported and patterns are registered on first compile.
"""

from __future__ import annotations

from .backend import AscendBackend
from .report import Fallback, FusionReport, GraphEntry

__all__ = ["AscendBackend", "Fallback", "FusionReport", "GraphEntry"]
