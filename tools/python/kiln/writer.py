"""The NVFP4 cache writer: bf16 latent rows -> the 384-byte-per-token cache that the sparse decode
reads (format: runtime/nvfp4_writer/README.md)."""
from __future__ import annotations

from . import _native
from ._torch import Tensor, is_compiling, torch
from .decode import _new_tensor

if torch is not None:
    from . import _ops

_NeedsDispatch = _native.NeedsDispatch


def nvfp4_pack(latent: Tensor, cache: Tensor | None = None) -> Tensor:
    """Quantize whole pages: ``latent`` bf16 ``[P, page_size, 512]`` into ``cache`` (uint8
    ``[P, page_size, 384]``, HND ``[P, 1, page_size, 384]`` or NHD ``[P, page_size, 1, 384]``;
    ``None`` allocates ``[P, page_size, 384]`` with torch). Returns the cache."""
    if cache is None:
        cache = _new_tensor((latent.shape[0], latent.shape[1], 384), torch.uint8 if torch else None, latent, "cache")
    if is_compiling():
        _ops.nvfp4_pack(latent, cache)
        return cache
    try:
        _native.nvfp4_pack(latent, cache)
    except _NeedsDispatch:
        _ops.nvfp4_pack(latent, cache)
    return cache


def nvfp4_append(rows: Tensor, slot_mapping: Tensor, cache: Tensor) -> None:
    """Quantize ``rows`` (bf16 ``[N, 512]``) into the cache slots ``slot_mapping`` (int32 ``[N]``,
    slot = page * page_size + row). Negative slots and slots past the cache are skipped; when several
    rows name one slot, the lowest row wins."""
    if is_compiling():
        _ops.nvfp4_append(rows, slot_mapping, cache)
        return
    try:
        _native.nvfp4_append(rows, slot_mapping, cache)
    except _NeedsDispatch:
        _ops.nvfp4_append(rows, slot_mapping, cache)
