"""mystique: replay PyTorch execution traces as portable benchmarks.

The command line (`mystique replay`, `mystique generate`, ...) comes with this package; from
Python, `mystique.capture(step, out=..., name=...)` captures a training or inference step the
way the replay's timing checks assume.
"""

from .capture import capture

__version__ = "0.1.0"
__all__ = ["capture"]
