"""The sparse MLA decode over DeepSeek-V4.1's mixed cache, with FlashInfer's names and signatures:
``cake_sparse_mla_sm120_dsv41_mixed_decode`` and its companion functions ``..._format_info``,
``..._num_chunks``, ``..._plan_head_tiles``, ``..._plan_splits``, ``..._scratch_bytes`` and
``..._supported_heads`` (contract: runtime/sparse_dsv41/README.md). The decode launches on the current
torch stream of the tensors' device (or the stream of :func:`kiln.use_stream`), reads no device memory
on the host and allocates nothing.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from . import _native
from ._torch import Tensor, is_compiling, torch
from .decode import _profiling

if torch is not None:
    from . import _ops

_decode_native = _native.dsv41_decode
_NeedsDispatch = _native.NeedsDispatch


def cake_sparse_mla_sm120_dsv41_mixed_decode(q: Tensor, kv_cache: Tensor, indices: Tensor, output: Tensor, out_lse: Tensor, sm_scale: float, *, topk_length: Tensor | None = None, attn_sink: Tensor | None = None, extra_kv_cache: Tensor | None = None, extra_indices: Tensor | None = None, extra_topk_length: Tensor | None = None, mid_out: Tensor | None = None, mid_lse: Tensor | None = None, lse_scale: float = 1.0, num_splits: int | None = None, max_splits: int = 16, head_tiles: int | None = None, variant: str | None = None, compute_precision: str = "bf16", enable_pdl: bool | None = None) -> Dict[str, Any]:  # noqa: E501
    """Run the allocation-free sparse MLA decode over the 528-byte FP8 main cache and the optional
    288-byte FP4 extra cache (FOOTER layout; q stays bf16).

    Writes ``output`` ``[T, H, 512]`` bf16 and ``out_lse`` ``[T, H]`` fp32 (base-2 LSE times
    ``lse_scale``) in place and returns the resolved plan ``{"variant", "head_tiles", "num_splits",
    "chunks_per_block", "precision"}`` (precision 0 is bf16). ``mid_out`` / ``mid_lse`` are required
    when the plan splits; :func:`cake_sparse_mla_sm120_dsv41_mixed_num_chunks` splits cover every plan.
    ``variant`` is None (kiln's choice for the device) or one of ``format_info()["variants"]``;
    ``compute_precision`` is ``"default"`` or ``"bf16"``; ``enable_pdl`` None means on.
    """
    args = (q, kv_cache, indices, output, out_lse, sm_scale, topk_length, attn_sink, extra_kv_cache, extra_indices,
            extra_topk_length, mid_out, mid_lse, lse_scale, num_splits, max_splits, head_tiles, variant,
            compute_precision, enable_pdl)
    if is_compiling():
        plan = _traced_plan(q, indices, extra_indices, num_splits, max_splits, head_tiles, variant,
                            topk_length is not None or extra_topk_length is not None)
        _ops.dsv41_decode(*args)
        return plan
    if _profiling():
        _ops.dsv41_decode(*args)
        return _plan_of(*args)
    try:
        return _decode_native(*args)
    except _NeedsDispatch:
        _ops.dsv41_decode(*args)
        return _plan_of(*args)


def cake_sparse_mla_sm120_dsv41_mixed_format_info() -> dict:
    """Static facts of the decode as kiln serves it, with upstream's keys. ``variants`` are kiln's own
    decode kernels ("default" first); ``compute_precisions`` is ``("bf16",)``; ``kernels_available``
    says whether kiln serves the current device; ``kernel_commit`` names kiln's build."""
    from . import __version__

    return {
        "query_dim": 512,
        "value_dim": 512,
        "main_bytes_per_token": 528,
        "main_data_bytes": 512,
        "main_scale_bytes": 16,
        "main_scale_group": 32,
        "extra_bytes_per_token": 288,
        "extra_data_bytes": 256,
        "extra_scale_bytes": 32,
        "extra_scale_group": 16,
        "chunk_width": 64,
        "extra_chunk_width": 64,
        "heads_per_block": 16,
        "max_chunks_per_block": 16,
        "heads": cake_sparse_mla_sm120_dsv41_mixed_supported_heads(),
        "two_tile_heads": tuple(_native.dsv41_two_tile_heads()),
        "compute_precisions": ("bf16",),
        "default_compute_precision": "bf16",
        "variants": tuple(_native.dsv41_variants()),
        "runtime_page": True,
        "runtime_extra_page": True,
        "kernels_available": _native.dsv41_kernels_available(_current_device()),
        "kernel_commit": f"kiln-{__version__}",
    }


def cake_sparse_mla_sm120_dsv41_mixed_supported_heads() -> Tuple[int, ...]:
    """Head counts the decode accepts: (8, 16, 32, 48, 64, 80, 96, 112, 128)."""
    return tuple(_native.dsv41_supported_heads())


def cake_sparse_mla_sm120_dsv41_mixed_num_chunks(topk: int, extra_topk: int = 0) -> int:
    """64-candidate chunks of one token (a zero count adds none): the upper bound on ``num_splits``."""
    return _native.dsv41_num_chunks(int(topk), int(extra_topk))


def cake_sparse_mla_sm120_dsv41_mixed_plan_head_tiles(*, num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0, num_sms: int) -> int:  # noqa: E501
    """16-head tiles one gather serves: 2 for H in ``two_tile_heads``, else 1."""
    return _native.dsv41_plan_head_tiles(int(num_tokens), int(num_heads), int(topk), int(extra_topk), int(num_sms))


def cake_sparse_mla_sm120_dsv41_mixed_plan_splits(*, num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0, num_sms: int, max_splits: int = 16, head_tiles: int = 1, unified_memory: bool = False, ragged: bool = False) -> Tuple[int, int]:  # noqa: E501
    """``(num_splits, chunks_per_block)`` for one decode call; ``unified_memory`` is GB10's policy,
    ``ragged`` a call with topk_length or extra_topk_length."""
    return _native.dsv41_plan_splits(int(num_tokens), int(num_heads), int(topk), int(extra_topk), int(num_sms),
                                     int(max_splits), int(head_tiles), bool(unified_memory), bool(ragged))


def cake_sparse_mla_sm120_dsv41_mixed_scratch_bytes(num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0) -> int:  # noqa: E501
    """Bytes of ``mid_out`` + ``mid_lse`` + an fp32 LSE (+ alignment slack) that cover every plan."""
    return _native.dsv41_scratch_bytes(int(num_tokens), int(num_heads), int(topk), int(extra_topk))


def _current_device() -> int:
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_device()
    return 0


def _plan(tokens, heads, topk, extra_topk, device, num_splits, max_splits, head_tiles, variant, ragged) -> Dict[str, Any]:
    return _native.dsv41_resolve_plan(int(tokens), int(heads), int(topk), int(extra_topk), int(device), num_splits,
                                      int(max_splits), head_tiles, variant, bool(ragged))


def _plan_of(q, kv_cache, indices, output, out_lse, sm_scale, topk_length, attn_sink, extra_kv_cache, extra_indices,
             extra_topk_length, mid_out, mid_lse, lse_scale, num_splits, max_splits, head_tiles, variant,
             compute_precision, enable_pdl) -> Dict[str, Any]:
    """The plan of a call that went through the dispatcher (which validated it)."""
    extra_topk = 0 if extra_indices is None else extra_indices.shape[-1]
    return _plan(q.shape[0], q.shape[1], indices.shape[-1], extra_topk, q.device.index, num_splits, max_splits,
                 head_tiles, variant, topk_length is not None or extra_topk_length is not None)


if torch is not None:
    # Traced calls: the plan depends only on shapes, arguments and the device, so it is computed once
    # while tracing and enters the graph as a constant.
    _plan_constant = torch.compiler.assume_constant_result(_plan)

    def _traced_plan(q, indices, extra_indices, num_splits, max_splits, head_tiles, variant, ragged) -> Dict[str, Any]:
        extra_topk = 0 if extra_indices is None else extra_indices.shape[-1]
        return _plan_constant(q.shape[0], q.shape[1], indices.shape[-1], extra_topk, q.device.index, num_splits,
                              max_splits, head_tiles, variant, ragged)
