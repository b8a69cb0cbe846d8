"""torch, when installed: the tensor and dtype names of the public signatures, the current-stream
lookup and the compile check. kiln imports and its non-torch paths work without torch."""
from __future__ import annotations

from . import _native

try:
    import torch
except ImportError:  # kiln without torch: any DLPack CUDA tensor, dtypes by name
    torch = None

if torch is not None:
    from torch import Tensor, dtype

    bfloat16 = torch.bfloat16
    is_compiling = torch.compiler.is_compiling
    _native.init_torch(torch)
else:

    class Tensor:  # type: ignore[no-redef]
        """Without torch: any object with ``__dlpack__`` describing CUDA memory."""

    class dtype(str):  # type: ignore[no-redef]
        """Without torch: a dtype by name."""

    bfloat16 = dtype("bfloat16")

    def is_compiling() -> bool:
        return False
