"""The two decode entry points with FlashInfer's signatures, their planners and workspace sizing.

``prims_ts_batch_decode_with_kv_cache_mla`` is
``flashinfer.attention.prims_ts.prims_ts_batch_decode_with_kv_cache_mla`` and
``cake_sparse_mla_sm120_dsv4_nvfp4_decode`` is ``flashinfer.mla.cake_sparse_mla_sm120_dsv4_nvfp4_decode``
(names, parameters, keyword-only markers, defaults and return types as upstream; contracts in
runtime/mla_decode/README.md and runtime/sparse_nvfp4/README.md). Both launch on the current torch stream of the
tensors' device (or the stream of :func:`kiln.use_stream`), read no device memory on the host and,
given their outputs, allocate nothing.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Dict, Iterator, Literal, Tuple

from . import _native
from ._torch import Tensor, bfloat16, dtype, is_compiling, torch
from .errors import InvalidArgumentError

if torch is not None:
    from . import _ops

_mla_native = _native.mla_decode
_sparse_native = _native.sparse_decode
_NeedsDispatch = _native.NeedsDispatch

if torch is not None and hasattr(torch._C, "_autograd") and hasattr(torch._C._autograd, "_profiler_enabled"):
    # While torch.profiler records, eager calls go through the dispatcher so that they appear as the
    # kiln::* ops; otherwise this is one C call per launch.
    _profiling = torch._C._autograd._profiler_enabled
else:
    def _profiling() -> bool:
        return False

MlaPrecision = Literal['exact', 'bf16']
_mla_precision: contextvars.ContextVar[str] = contextvars.ContextVar("kiln_mla_precision", default="exact")


@contextlib.contextmanager
def mla_precision(precision: MlaPrecision) -> Iterator[None]:
    """Run :func:`prims_ts_batch_decode_with_kv_cache_mla` calls in this scope (this thread or task)
    with ``precision``: ``"exact"`` (the default; P carried as bf16 hi + lo, within the contract's
    tolerances on every input) or ``"bf16"`` (one bf16 P, FlashMLA's numerics; bf16 pages only).
    Warm the key with the same ``precision`` (:func:`kiln.warm_mla`) before capturing a graph.
    A scope, not an argument, so that the seed signature stays upstream's."""
    if precision not in ("exact", "bf16"):
        raise InvalidArgumentError(f"kiln [invalid_argument]: precision: expected 'exact' or 'bf16', got {precision!r}")
    token = _mla_precision.set(precision)
    try:
        yield
    finally:
        _mla_precision.reset(token)


def prims_ts_batch_decode_with_kv_cache_mla(query: Tensor, kv_cache: Tensor, workspace_buffer: Tensor, kv_lora_rank: int, qk_rope_head_dim: int, block_tables: Tensor, seq_lens: Tensor, max_seq_len: int, *, qo_indptr: Tensor | None = None, max_seq_len_q: int | None = None, out: Tensor | None = None, bmm1_scale: float = 1.0, bmm2_scale: float = 1.0, mask_type: Literal['dense', 'causal'] = 'causal', out_dtype: dtype = bfloat16) -> Tensor:  # noqa: E501
    """Launch fixed or packed-query paged MLA decode with caller-owned scratch.

    query is ``[B, SQ, H, 576]`` (``qo_indptr=None``) or packed ``[total_q, H, 576]`` with
    ``qo_indptr`` (B + 1 cumulative offsets, read only on the device) and ``max_seq_len_q``;
    kv_cache is ``[pages, page_size, 576]`` or ``[pages, 1, page_size, 576]``; block_tables int32
    ``[B, max_pages]``; seq_lens int32 ``[B]``. ``workspace_buffer`` is uint8 of at least
    :func:`mla_workspace_size` bytes, exclusive to this launch or captured graph. Causal masking is
    bottom-right aligned. Warm the key (:func:`kiln.warm_mla`) before CUDA graph capture and pass
    ``out`` to avoid allocating the output (``out=None`` allocates it with torch). Returns ``out``.
    The numerics of P on bf16 pages come from the enclosing :func:`kiln.mla_precision` scope
    (default ``"exact"``).
    """
    if out is None:
        out = _new_tensor((*query.shape[:-1], kv_lora_rank), out_dtype, query, "out")
    precision = _precision_constant() if is_compiling() else _mla_precision.get()
    if is_compiling() or _profiling():
        _ops.mla_decode(query, kv_cache, workspace_buffer, kv_lora_rank, qk_rope_head_dim, block_tables, seq_lens,
                        max_seq_len, qo_indptr, max_seq_len_q, out, bmm1_scale, bmm2_scale, mask_type, out_dtype, precision)
        return out
    try:
        _mla_native(query, kv_cache, workspace_buffer, kv_lora_rank, qk_rope_head_dim, block_tables, seq_lens,
                    max_seq_len, qo_indptr, max_seq_len_q, out, bmm1_scale, bmm2_scale, mask_type, out_dtype, precision)
    except _NeedsDispatch:
        _ops.mla_decode(query, kv_cache, workspace_buffer, kv_lora_rank, qk_rope_head_dim, block_tables, seq_lens,
                        max_seq_len, qo_indptr, max_seq_len_q, out, bmm1_scale, bmm2_scale, mask_type, out_dtype,
                        precision)
    return out


def cake_sparse_mla_sm120_dsv4_nvfp4_decode(q: Tensor, kv_cache: Tensor, indices: Tensor, output: Tensor, out_lse: Tensor, sm_scale: float, *, topk_length: Tensor | None = None, attn_sink: Tensor | None = None, extra_kv_cache: Tensor | None = None, extra_indices: Tensor | None = None, extra_topk_length: Tensor | None = None, mid_out: Tensor | None = None, mid_lse: Tensor | None = None, lse_scale: float = 1.0, num_splits: int | None = None, max_splits: int = 16, head_tiles: int | None = None) -> Dict[str, int]:  # noqa: E501
    """Run the allocation-free sparse MLA decode over the 384-byte NVFP4 cache.

    Writes ``output`` ``[T, H, 512]`` bf16 and ``out_lse`` ``[T, H]`` fp32 (base-2 LSE times
    ``lse_scale``) in place and returns the resolved plan ``{"head_tiles", "num_splits",
    "chunks_per_block"}``. ``mid_out`` / ``mid_lse`` are required when the plan splits; size them
    with :func:`cake_sparse_mla_sm120_dsv4_nvfp4_num_chunks` splits to cover every plan.
    ``head_tiles`` (1 or 2; 2 needs H % 32 == 0) and ``num_splits`` override the planners.
    """
    if is_compiling():
        plan = _traced_plan(q, indices, extra_indices, num_splits, max_splits, head_tiles)
        _ops.sparse_decode(q, kv_cache, indices, output, out_lse, sm_scale, topk_length, attn_sink, extra_kv_cache,
                           extra_indices, extra_topk_length, mid_out, mid_lse, lse_scale, num_splits, max_splits,
                           head_tiles)
        return plan
    if _profiling():
        _ops.sparse_decode(q, kv_cache, indices, output, out_lse, sm_scale, topk_length, attn_sink, extra_kv_cache,
                           extra_indices, extra_topk_length, mid_out, mid_lse, lse_scale, num_splits, max_splits,
                           head_tiles)
        return _plan(q.shape[0], q.shape[1], indices.shape[-1], 0 if extra_indices is None else extra_indices.shape[-1],
                     q.device.index, num_splits, max_splits, head_tiles)
    try:
        return _sparse_native(q, kv_cache, indices, output, out_lse, sm_scale, topk_length, attn_sink, extra_kv_cache,
                              extra_indices, extra_topk_length, mid_out, mid_lse, lse_scale, num_splits, max_splits,
                              head_tiles)
    except _NeedsDispatch:
        _ops.sparse_decode(q, kv_cache, indices, output, out_lse, sm_scale, topk_length, attn_sink, extra_kv_cache,
                           extra_indices, extra_topk_length, mid_out, mid_lse, lse_scale, num_splits, max_splits,
                           head_tiles)
        return _plan(q.shape[0], q.shape[1], indices.shape[-1], 0 if extra_indices is None else extra_indices.shape[-1],
                     q.device.index, num_splits, max_splits, head_tiles)


def cake_sparse_mla_sm120_dsv4_nvfp4_format_info() -> dict:
    """Static facts of the sparse decode as kiln serves it, with upstream's keys. ``heads`` is every
    head count kiln's launcher accepts (each multiple of 8 up to 128: more than upstream's instances),
    ``two_tile_heads`` those that take ``head_tiles=2``. kiln has no prefill family, so the prefill
    keys are empty and ``prefill_max_chunks`` is 0; ``kernel_commit`` names kiln's build instead of
    upstream's generated kernels."""
    from . import __version__

    return {
        "query_dim": 512,
        "value_dim": 512,
        "bytes_per_token": 384,
        "chunk_width": 64,
        "heads_per_block": 16,
        "max_chunks_per_block": 16,
        "heads": cake_sparse_mla_sm120_dsv4_nvfp4_supported_heads(),
        "two_tile_heads": tuple(range(32, 129, 32)),
        "runtime_page": True,
        "runtime_extra_page": True,
        "kernel_commit": f"kiln-{__version__}",
        "prefill_heads": (),
        "prefill_head_tiles": {},
        "prefill_max_chunks": 0,
        "prefill_kernel_commit": None,
    }


def cake_sparse_mla_sm120_dsv4_nvfp4_supported_heads() -> Tuple[int, ...]:
    """Head counts the sparse decode accepts: every multiple of 8 in [8, 128]."""
    return tuple(range(8, 129, 8))


def cake_sparse_mla_sm120_dsv4_nvfp4_num_chunks(topk: int, extra_topk: int = 0) -> int:
    """64-candidate chunks of one token: the upper bound on ``num_splits``."""
    return _native.sparse_num_chunks(int(topk), int(extra_topk))


def cake_sparse_mla_sm120_dsv4_nvfp4_plan_head_tiles(*, num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0, num_sms: int) -> int:  # noqa: E501
    """16-head tiles per decode block (1 or 2) for this call shape on a device with ``num_sms`` SMs."""
    return _native.sparse_plan_head_tiles(int(num_tokens), int(num_heads), int(topk), int(extra_topk), int(num_sms))


def cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits(*, num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0, num_sms: int, max_splits: int = 16, head_tiles: int = 1) -> Tuple[int, int]:  # noqa: E501
    """``(num_splits, chunks_per_block)`` for one decode call."""
    return _native.sparse_plan_splits(int(num_tokens), int(num_heads), int(topk), int(extra_topk), int(num_sms),
                                      int(max_splits), int(head_tiles))


def cake_sparse_mla_sm120_dsv4_nvfp4_scratch_bytes(num_tokens: int, num_heads: int, topk: int, extra_topk: int = 0) -> int:  # noqa: E501
    """Bytes of ``mid_out`` + ``mid_lse`` (+ alignment slack) that cover every split plan of this shape."""
    return _native.sparse_scratch_bytes(int(num_tokens), int(num_heads), int(topk), int(extra_topk))


def mla_workspace_size(num_heads: int, page_size: int, max_seq_len: int, max_seq_len_q: int, batch: int, *,
                       packed: bool = False, dtype: dtype = bfloat16, out_dtype: dtype = bfloat16,
                       mask_type: Literal['dense', 'causal'] = 'causal') -> int:
    """Bytes of ``workspace_buffer`` for one paged MLA decode launch of this static policy at ``batch``
    requests (0: this policy never splits at this batch). Independent of the device. Not monotonic in
    ``batch``: a buffer shared by graphs of several batch sizes needs the maximum over them. ``dtype``
    is the query and cache type (bf16, or float8_e4m3fn)."""
    return _native.mla_workspace_size(int(num_heads), int(page_size), int(max_seq_len), int(max_seq_len_q),
                                      bool(packed), dtype, out_dtype, mask_type, int(batch))


def _new_tensor(shape, tensor_dtype, like, name):
    """An output allocated with torch on `like`'s device (the out=None convenience path)."""
    if torch is None:
        raise InvalidArgumentError(f"kiln [invalid_argument]: {name}: pass a preallocated tensor; allocating one needs torch")
    device = like.device if isinstance(like, torch.Tensor) else torch.device("cuda", like.__dlpack_device__()[1])
    return torch.empty(shape, dtype=tensor_dtype, device=device)


def _plan(tokens, heads, topk, extra_topk, device, num_splits, max_splits, head_tiles) -> Dict[str, int]:
    return _native.sparse_resolve_plan(int(tokens), int(heads), int(topk), int(extra_topk),
                                       _native.device_sm_count(device), num_splits, max_splits, head_tiles)


def _scope_precision() -> str:
    return _mla_precision.get()


if torch is not None:
    # Traced calls read the mla_precision scope once, while tracing (Dynamo cannot trace a context
    # variable): the precision enters the graph as a constant, so a compiled function keeps the
    # scope it was first traced in.
    _precision_constant = torch.compiler.assume_constant_result(_scope_precision)

    # Traced calls: the plan depends only on shapes, arguments and the device's SM count, so it is
    # computed once while tracing and enters the graph as a constant.
    _plan_constant = torch.compiler.assume_constant_result(_plan)

    def _traced_plan(q, indices, extra_indices, num_splits, max_splits, head_tiles) -> Dict[str, int]:
        extra_topk = 0 if extra_indices is None else extra_indices.shape[-1]
        return _plan_constant(q.shape[0], q.shape[1], indices.shape[-1], extra_topk, q.device.index, num_splits,
                              max_splits, head_tiles)
