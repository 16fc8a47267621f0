"""hwinfer: one model definition, every accelerator.

``load_model(path, device=...)`` loads a published checkpoint; ``hwinfer.backend`` holds the
device registry and op selection; ``hwinfer.ops`` the op contracts.
"""
from hwinfer.api import load_model

__version__ = "0.1.0"
__all__ = ["load_model"]
