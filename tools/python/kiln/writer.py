"""The cache writers: bf16 latent rows -> the 384-byte NVFP4 cache that the sparse decode reads
(runtime/nvfp4_writer/README.md), and bf16/fp16 rows -> the DeepSeek-V4.1 528-byte FP8 and 288-byte
FP4 caches (runtime/dsv41_writer/README.md)."""
from __future__ import annotations

from . import _native
from ._torch import Tensor, is_compiling, torch
from .decode import _new_tensor
from .errors import InvalidArgumentError

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


# ---- DeepSeek-V4.1 caches (runtime/dsv41_writer/README.md): FlashInfer's four writer functions ----

_RECORD_BYTES = {"fp8": 528, "fp4": 288}


def _shape_from_python(fmt: str, latent_kv: Tensor, kv_layout: str):
    """pack's result shape from the latent's shape alone (traced calls and tensor subclasses, whose
    storage the native checks cannot read; the op checks everything when it runs)."""
    if kv_layout not in ("HND", "NHD"):
        raise InvalidArgumentError(f'kiln [invalid_argument]: kv_layout must be "HND" or "NHD"; got {kv_layout!r}')
    shape = tuple(latent_kv.shape)
    if len(shape) == 2:
        raise InvalidArgumentError("kiln [invalid_argument]: full-page pack requires a page dimension; "
                                   f"argument 'latent_kv': expected [num_pages, page_size, 512], got shape {list(shape)}")
    pages, page = shape[0], shape[2] if len(shape) == 4 and shape[1] == 1 else shape[1]
    record = _RECORD_BYTES[fmt]
    return (pages, 1, page, record) if kv_layout == "HND" else (pages, page, 1, record)


def _pack(fmt: str, latent_kv: Tensor, kv_layout: str) -> Tensor:
    if is_compiling():
        cache = _new_tensor(_shape_from_python(fmt, latent_kv, kv_layout), torch.uint8, latent_kv, "cache")
        _ops.dsv41_pack(fmt, latent_kv, cache)
        return cache
    try:
        shape = _native.dsv41_pack_shape(fmt, latent_kv, kv_layout)  # checks before anything is allocated
    except _NeedsDispatch:
        shape = _shape_from_python(fmt, latent_kv, kv_layout)
    cache = _new_tensor(shape, torch.uint8 if torch else None, latent_kv, "cache")
    try:
        _native.dsv41_pack(fmt, latent_kv, cache)
    except _NeedsDispatch:
        _ops.dsv41_pack(fmt, latent_kv, cache)
    return cache


def _append(fmt: str, latent_kv: Tensor, slot_mapping: Tensor, cache: Tensor) -> None:
    if is_compiling():
        _ops.dsv41_append(fmt, latent_kv, slot_mapping, cache)
        return
    try:
        _native.dsv41_append(fmt, latent_kv, slot_mapping, cache)
    except _NeedsDispatch:
        _ops.dsv41_append(fmt, latent_kv, slot_mapping, cache)


def dsv41_fp8_quantize_pack_sparse_mla_cache(latent_kv: Tensor, *, kv_layout: str = 'HND') -> Tensor:
    """Quantize whole pages of DeepSeek-V4.1 latent rows into a new 528-byte FP8 cache.

    ``latent_kv``: contiguous CUDA bf16 or fp16 ``[num_pages, page_size, 512]`` (a singleton head
    axis in HND or NHD position is accepted). Each group of 32 values gets one power-of-two (UE8M0)
    scale and 32 E4M3 codes. Returns uint8 ``[num_pages, 1, page_size, 528]`` (``kv_layout="HND"``)
    or ``[num_pages, page_size, 1, 528]`` (``"NHD"``); a page holds ``page_size * 512`` code bytes,
    then ``page_size * 16`` scale bytes, so the last dimension is not one token's record."""
    return _pack("fp8", latent_kv, kv_layout)


def dsv41_fp8_quantize_append_sparse_mla_cache(latent_kv: Tensor, slot_mapping: Tensor, cache: Tensor) -> None:
    """Quantize ``latent_kv`` (bf16 or fp16 ``[N, 512]``) into the 528-byte FP8 ``cache`` (any
    accepted view) at ``slot_mapping`` (int32 or int64 ``[N]``, slot = page * page_size + row).
    Negative and out-of-range slots are skipped; a slot named twice keeps its lowest row. Only the
    addressed rows' code and scale bytes are written."""
    _append("fp8", latent_kv, slot_mapping, cache)


def dsv41_fp4_quantize_pack_sparse_mla_cache(latent_kv: Tensor, *, kv_layout: str = 'HND') -> Tensor:
    """Quantize whole pages of DeepSeek-V4.1 latent rows into a new 288-byte FP4 cache: each group
    of 16 values gets one E4M3 scale and 16 E2M1 codes (two per byte). Shapes as
    :func:`dsv41_fp8_quantize_pack_sparse_mla_cache`, with 288-byte records (``page_size * 256`` code
    bytes, then ``page_size * 32`` scale bytes per page)."""
    return _pack("fp4", latent_kv, kv_layout)


def dsv41_fp4_quantize_append_sparse_mla_cache(latent_kv: Tensor, slot_mapping: Tensor, cache: Tensor) -> None:
    """:func:`dsv41_fp8_quantize_append_sparse_mla_cache` for the 288-byte FP4 cache."""
    _append("fp4", latent_kv, slot_mapping, cache)
