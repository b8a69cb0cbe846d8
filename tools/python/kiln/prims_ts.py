"""FlashInfer's current paged MLA decode surface on kiln's launcher, and the validating path.

Newer FlashInfer renames the seed's functions (``prims_ts_batch_mla_decode_with_kv_cache``,
``get_prims_ts_batch_mla_decode_workspace_size``) and adds the plan/run wrapper
``BatchMLADecodePagedTSWrapper`` and the one-shot ``batch_mla_decode_with_paged_kv_cache``; all of
them are here with upstream's names and parameters, beside the seed names, which stay.

The launch path reads nothing on the host. The validating path (``run(validate=True)``,
:func:`validate_mla_metadata`, :func:`validate_sparse_metadata`, the one-shot function) copies the
metadata to the host (a synchronisation) and raises ``ValueError`` (:class:`kiln.InvalidArgumentError`)
for the conditions upstream's validation refuses, with upstream's phrase first in the message. It is
refused inside CUDA graph capture and skipped while torch.compile traces.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Sequence

from . import _native
from ._torch import Tensor, bfloat16, dtype, is_compiling, torch
from .decode import (
    _NeedsDispatch,
    _mla_native,
    _mla_precision,
    _new_tensor,
    mla_workspace_size,
    prims_ts_batch_decode_with_kv_cache_mla,
)
from .errors import InvalidArgumentError, NotPlannedError, UnsupportedError

if torch is not None:
    from . import _ops

_LATENT, _ROPE, _QK = 512, 64, 576

# Upstream's new name for the seed function: the same callable, so it costs nothing extra per call.
prims_ts_batch_mla_decode_with_kv_cache = prims_ts_batch_decode_with_kv_cache_mla


def _invalid(upstream: str, arg: str, detail: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"kiln [invalid_argument]: {upstream}; argument '{arg}': {detail}")


def _check_dims(kv_lora_rank: int, qk_rope_head_dim: int) -> None:
    if (int(kv_lora_rank), int(qk_rope_head_dim)) != (_LATENT, _ROPE):
        raise UnsupportedError(
            "kiln [unsupported]: MLA decode currently requires kv_lora_rank=512 and qk_rope_head_dim=64; argument "
            f"'kv_lora_rank', 'qk_rope_head_dim': not implemented for {kv_lora_rank} and {qk_rope_head_dim}")


def _dtype_name(d: Any) -> str:
    """torch.bfloat16 and "bfloat16" alike -> "bfloat16"."""
    text = str(d)
    return text[len("torch."):] if text.startswith("torch.") else text


def _check_same_dtype(q_dtype: Any, kv_dtype: Any) -> None:
    if _dtype_name(q_dtype) != _dtype_name(kv_dtype):
        raise UnsupportedError(
            "kiln [unsupported]: MLA decode requires query and KV cache to use the same dtype; argument "
            f"'kv_data_type': not implemented for {q_dtype} with {kv_dtype} (pass the query's dtype)")


def get_prims_ts_batch_mla_decode_workspace_size(batch_size: int, num_heads: int, kv_lora_rank: int, qk_rope_head_dim: int, page_size: int, max_seq_len: int, *, seq_len_q: Optional[int] = None, max_seq_len_q: Optional[int] = None, q_dtype: dtype = bfloat16, kv_dtype: Optional[dtype] = None, out_dtype: dtype = bfloat16, mask_type: Literal['dense', 'causal'] = 'causal', device: Any = None) -> int:  # noqa: E501
    """Bytes of ``workspace_buffer`` for this static geometry, fixed or packed query (upstream's
    helper takes no packed flag, so the size covers both). ``seq_len_q`` is the older name of
    ``max_seq_len_q`` (default 1). kiln's size does not depend on the device; ``device`` is accepted
    for upstream's signature and ignored."""
    if seq_len_q is not None and max_seq_len_q is not None and int(seq_len_q) != int(max_seq_len_q):
        raise _invalid("seq_len_q and max_seq_len_q must agree when both are provided", "seq_len_q",
                       f"expected {max_seq_len_q} (max_seq_len_q), got {seq_len_q}")
    sq = int(max_seq_len_q if max_seq_len_q is not None else seq_len_q if seq_len_q is not None else 1)
    _check_dims(kv_lora_rank, qk_rope_head_dim)
    _check_same_dtype(q_dtype, q_dtype if kv_dtype is None else kv_dtype)
    return max(mla_workspace_size(num_heads, page_size, max_seq_len, sq, batch_size, packed=packed, dtype=q_dtype,
                                  out_dtype=out_dtype, mask_type=mask_type) for packed in (False, True))


# The seed-era name of the same helper (upstream renamed it without an alias; kiln keeps both).
get_prims_ts_batch_decode_mla_workspace_size = get_prims_ts_batch_mla_decode_workspace_size


# ---------------------------------------------------------------------------------------------------
# Host reads for the validating path.

def _capturing() -> bool:
    return torch is not None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _host(values: Any, name: str) -> list:
    """The values of a metadata tensor on the host: torch tensors are copied back (a synchronisation);
    anything with ``tolist()`` (numpy) or a sequence is taken as is."""
    if hasattr(values, "tolist"):
        return values.tolist()
    if isinstance(values, (list, tuple)):
        return list(values)
    raise TypeError(f"{name}: validation reads the values on the host; pass a torch tensor, an array with tolist() "
                    f"or a sequence, got {type(values).__name__}")


def _begin_validation() -> bool:
    """False when validation must be skipped (torch.compile tracing); raises inside graph capture."""
    if is_compiling():
        return False
    if _capturing():
        raise InvalidArgumentError(
            "kiln [invalid_argument]: validation copies metadata to the host, which CUDA graph capture forbids; "
            "argument 'validate': pass validate=False inside the capture (validate representative inputs before it)")
    return True


def _shape(t: Any, name: str) -> tuple:
    shape = getattr(t, "shape", None)
    if shape is None:
        raise TypeError(f"{name}: expected a tensor with a shape, got {type(t).__name__}")
    return tuple(int(s) for s in shape)


def _mla_pages(kv_cache: Any) -> int:
    return _shape(kv_cache, "kv_cache")[0]


def _mla_page_size(kv_cache: Any) -> int:
    return _shape(kv_cache, "kv_cache")[-2]


def _check_mla_values(*, batch: int, q_lengths: Sequence[int], lens: Sequence[int], tables: Sequence[Sequence[int]],
                      pages: int, page_size: int, bound: int, bound_name: str, causal: bool) -> None:
    for b, length in enumerate(lens):
        if length <= 0:
            raise _invalid("every runtime request must contain at least one KV token", "seq_lens",
                           f"expected every value in 1..{bound_name} = 1..{bound}, got seq_lens[{b}] = {length}")
    longest = max(lens, default=0)
    if longest > bound:
        raise _invalid(f"runtime KV metadata contains a request longer than max_kv_len ({bound}): got {longest}",
                       "seq_lens", f"expected every value <= {bound_name} = {bound}, got {longest}")
    for b, (row, length) in enumerate(zip(tables, lens)):
        needed = -(-length // page_size)
        for j, page in enumerate(row[:needed]):
            if not 0 <= page < pages:
                raise _invalid(
                    f"block_tables values for active pages must index the physical K/V cache in [0, {pages}); "
                    f"request {b} contains an invalid page ID", "block_tables",
                    f"expected page ids in [0, {pages}) in the first ceil(seq_lens[{b}] / {page_size}) = {needed} "
                    f"columns, got block_tables[{b}][{j}] = {page}")
    if causal:
        for b, (q_len, kv_len) in enumerate(zip(q_lengths, lens)):
            if q_len > kv_len:
                raise _invalid(
                    "causal MLA decode requires every per-request Q length to be no greater than its K/V length; "
                    f"request {b} has Q={q_len} and K/V={kv_len}", "seq_lens",
                    f"expected seq_lens[{b}] >= {q_len} (its query rows) with mask_type='causal', got {kv_len}")


def _q_lengths_from_indptr(offsets: Sequence[int], batch: int, total_q: int, max_seq_len_q: Optional[int]) -> list:
    if len(offsets) != batch + 1:
        raise _invalid("qo_indptr must contain batch_size + 1 offsets", "qo_indptr",
                       f"expected {batch + 1} offsets, got {len(offsets)}")
    if offsets[0] != 0:
        raise _invalid("qo_indptr must start at 0", "qo_indptr", f"expected qo_indptr[0] = 0, got {offsets[0]}")
    lengths = [offsets[i + 1] - offsets[i] for i in range(batch)]
    for b, n in enumerate(lengths):
        if n < 0:
            raise _invalid("qo_indptr must be nondecreasing", "qo_indptr",
                           f"expected qo_indptr[{b + 1}] >= qo_indptr[{b}], got {offsets[b + 1]} < {offsets[b]}")
    if offsets[-1] != total_q:
        raise _invalid(f"qo_indptr must end at the packed query row count ({total_q}), got {offsets[-1]}", "qo_indptr",
                       f"expected qo_indptr[{batch}] = query.shape[0] = {total_q}, got {offsets[-1]}")
    longest = max(lengths, default=0)
    if max_seq_len_q is not None and longest > max_seq_len_q:
        raise _invalid(f"qo_indptr contains a per-request Q length larger than max_seq_len_q ({max_seq_len_q}): "
                       f"got {longest}", "qo_indptr", f"expected every step <= max_seq_len_q = {max_seq_len_q}")
    return lengths


def validate_mla_metadata(query: Tensor, kv_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, max_seq_len: int, *, qo_indptr: Optional[Tensor] = None, max_seq_len_q: Optional[int] = None, mask_type: Literal['dense', 'causal'] = 'causal') -> None:  # noqa: E501
    """Read the metadata of a :func:`kiln.prims_ts_batch_decode_with_kv_cache_mla` call back to the
    host and raise ``ValueError`` (:class:`kiln.InvalidArgumentError`) for what the launch would
    silently mishandle: a length <= 0 or > ``max_seq_len``; a page id outside ``[0, kv_cache pages)``
    among a request's active pages; a broken ``qo_indptr`` (wrong length, not starting at 0,
    decreasing, not ending at ``query.shape[0]``, a step > ``max_seq_len_q``); with
    ``mask_type='causal'``, a request with more query rows than KV tokens. Synchronises; refused
    inside CUDA graph capture, skipped while torch.compile traces. The metadata may also be host
    sequences (or arrays with ``tolist()``); shapes come from ``query`` and ``kv_cache``."""
    if not _begin_validation():
        return
    lens = [int(v) for v in _host(seq_lens, "seq_lens")]
    batch = len(lens)
    q_shape = _shape(query, "query")
    if qo_indptr is not None:
        q_lengths = _q_lengths_from_indptr([int(v) for v in _host(qo_indptr, "qo_indptr")], batch, q_shape[0],
                                           None if max_seq_len_q is None else int(max_seq_len_q))
    else:
        q_lengths = [q_shape[1] if len(q_shape) == 4 else 1] * batch
    tables = _host(block_tables, "block_tables")
    if len(tables) != batch:
        raise _invalid(f"block_tables must have one row per request: expected {batch}, got {len(tables)}",
                       "block_tables", f"expected {batch} rows (one per seq_lens entry), got {len(tables)}")
    _check_mla_values(batch=batch, q_lengths=q_lengths, lens=lens, tables=tables, pages=_mla_pages(kv_cache),
                      page_size=_mla_page_size(kv_cache), bound=int(max_seq_len), bound_name="max_seq_len",
                      causal=mask_type == "causal")


def _nvfp4_rows(cache: Any, name: str) -> int:
    """Cache rows (pages * page size) of a [P, page, 384], HND [P, 1, page, 384] or NHD [P, page, 1, 384] view."""
    shape = _shape(cache, name)
    page = shape[2] if len(shape) == 4 and shape[1] == 1 else shape[1]
    return shape[0] * page


def _check_slots(indices: Any, lengths: Optional[Any], rows: int, name: str, length_name: str) -> None:
    table = _host(indices, name)
    table = [r[0] if r and isinstance(r[0], list) else r for r in table]  # [T, 1, topk] -> [T, topk]
    lens = None if lengths is None else [int(v) for v in _host(lengths, length_name)]
    for t, row in enumerate(table):
        active = len(row)
        if lens is not None:
            n = lens[t]
            if not 0 <= n <= len(row):
                raise _invalid(f"{length_name} must be within [0, topk]", length_name,
                               f"expected {length_name}[{t}] in [0, {len(row)}] ({name}'s topk), got {n}")
            active = n
        for j in range(active):
            slot = int(row[j])
            if slot != -1 and not 0 <= slot < rows:
                raise _invalid(f"{name} entries must be -1 or a cache row in [0, {rows})", name,
                               f"expected -1 or [0, {rows}) (pages * page_size) in the active slots, got "
                               f"{name}[{t}][{j}] = {slot}")


def validate_sparse_metadata(kv_cache: Tensor, indices: Tensor, *, topk_length: Optional[Tensor] = None, extra_kv_cache: Optional[Tensor] = None, extra_indices: Optional[Tensor] = None, extra_topk_length: Optional[Tensor] = None) -> None:  # noqa: E501
    """Read the candidate lists of a :func:`kiln.cake_sparse_mla_sm120_dsv4_nvfp4_decode` call back to
    the host and raise ``ValueError`` (:class:`kiln.InvalidArgumentError`) when a length is outside
    ``[0, topk]`` or an active slot (``j < length``, every slot without lengths) is neither ``-1`` nor
    a row of its cache (``[0, pages * page_size)``). The launch masks any negative slot and clamps the
    lengths; this says which input broke the contract. Synchronises; refused inside CUDA graph
    capture, skipped while torch.compile traces."""
    if not _begin_validation():
        return
    _check_slots(indices, topk_length, _nvfp4_rows(kv_cache, "kv_cache"), "indices", "topk_length")
    if extra_indices is not None and extra_kv_cache is not None:
        _check_slots(extra_indices, extra_topk_length, _nvfp4_rows(extra_kv_cache, "extra_kv_cache"), "extra_indices",
                     "extra_topk_length")


# ---------------------------------------------------------------------------------------------------
# The plan/run wrapper.

def _device_index(device: Any) -> int:
    if isinstance(device, bool):
        raise TypeError("device: expected an int, 'cuda[:N]' or a torch.device")
    if isinstance(device, int):
        index = device
    else:
        text = str(device)
        if text == "cuda":
            index = torch.cuda.current_device() if torch is not None else 0
        elif text.startswith("cuda:") and text[5:].isdigit():
            index = int(text[5:])
        else:
            raise _invalid("device must be a CUDA device", "device", f"expected an int, 'cuda[:N]' or a torch.device, "
                                                                     f"got {device!r}")
    if index < 0:
        raise _invalid("device must be a CUDA device", "device", f"expected an index >= 0, got {index}")
    return index


class _MlaPlan:
    __slots__ = ("device", "batch_size", "num_heads", "page_size", "max_kv_len", "max_seq_len_q", "packed",
                 "q_dtype", "kv_dtype", "o_dtype", "mask_type", "precision", "workspace", "workspace_bytes",
                 "fixed_max_seq_len_q")


class BatchMLADecodePagedTSWrapper:
    """Plan a paged MLA decode shape once, then run it many times (upstream's wrapper, on kiln).

    :meth:`plan` checks the static geometry, compiles or loads the kernel for the device (kiln's
    warm-up: do it before CUDA graph capture) and binds or allocates the workspace; a failed re-plan
    leaves the previous plan in place. :meth:`run` launches that plan on the current stream; with
    ``validate=True`` (upstream's default) it first reads the metadata back to the host
    (:func:`validate_mla_metadata`), so pass ``validate=False`` inside CUDA graph capture and
    torch.compile. One wrapper's workspace serves one launch or captured graph at a time.
    """

    def __init__(self) -> None:
        self._plan: Optional[_MlaPlan] = None

    def plan(self, device: Any, batch_size: int, num_heads: int, kv_lora_rank: int, qk_rope_head_dim: int, page_size: int, max_kv_len: int, *, max_seq_len_q: int, packed_query: bool, q_data_type: dtype, kv_data_type: dtype, o_data_type: dtype, mask_type: Literal['dense', 'causal'] = 'causal', workspace_buffer: Optional[Tensor] = None, precision: Optional[Literal['exact', 'bf16']] = None) -> None:  # noqa: E501
        """Compile (or load) and bind one static MLA shape. ``max_kv_len`` is kiln's ``max_seq_len``
        (part of the key); ``max_seq_len_q`` is SQ for a fixed query and the per-request bound for a
        packed one. ``workspace_buffer`` (uint8/int8, at least
        :func:`get_prims_ts_batch_mla_decode_workspace_size` bytes) is allocated when omitted.
        ``precision`` (kiln's keyword) fixes the numerics of P for this plan; ``None`` takes the
        enclosing :func:`kiln.mla_precision` scope at plan time."""
        if not isinstance(packed_query, bool):
            raise TypeError("packed_query must be a bool")
        if mask_type not in ("dense", "causal"):
            raise _invalid("mask_type must be 'dense' or 'causal'", "mask_type",
                           f"expected 'dense' or 'causal', got {mask_type!r}")
        _check_dims(kv_lora_rank, qk_rope_head_dim)
        _check_same_dtype(q_data_type, kv_data_type)
        if precision is None:
            precision = _mla_precision.get()
        if precision not in ("exact", "bf16"):
            raise _invalid("precision must be 'exact' or 'bf16'", "precision",
                           f"expected 'exact', 'bf16' or None, got {precision!r}")
        batch_size, num_heads, page_size = int(batch_size), int(num_heads), int(page_size)
        max_kv_len, max_seq_len_q = int(max_kv_len), int(max_seq_len_q)
        if batch_size < 1:
            raise _invalid("batch_size must be positive", "batch_size", f"expected >= 1, got {batch_size}")
        index = _device_index(device)
        # The C++ policy rules (heads, page size, lengths, dtypes) are checked by the size computation.
        workspace_bytes = _native.mla_workspace_size(num_heads, page_size, max_kv_len, max_seq_len_q, packed_query,
                                                     q_data_type, o_data_type, mask_type, batch_size)
        if workspace_buffer is None:
            if torch is None:
                raise _invalid("workspace_buffer is required without torch", "workspace_buffer",
                               "a preallocated buffer: allocating one needs torch")
            workspace_buffer = torch.empty(max(workspace_bytes, 1), dtype=torch.uint8,
                                           device=torch.device("cuda", index))
        else:
            shape = _shape(workspace_buffer, "workspace_buffer")
            if len(shape) != 1 or shape[0] < workspace_bytes:
                raise _invalid("workspace_buffer is too small for the planned MLA decode", "workspace_buffer",
                               f"expected a 1-D uint8/int8 buffer of at least {workspace_bytes} bytes, got shape "
                               f"{shape}")
        _native.warm_mla(num_heads, page_size, max_kv_len, max_seq_len_q, packed_query, q_data_type, o_data_type,
                         mask_type, precision, [index])
        p = _MlaPlan()
        p.device, p.batch_size, p.num_heads, p.page_size = index, batch_size, num_heads, page_size
        p.max_kv_len, p.max_seq_len_q, p.packed = max_kv_len, max_seq_len_q, packed_query
        p.fixed_max_seq_len_q = None if packed_query else max_seq_len_q
        p.q_dtype, p.kv_dtype, p.o_dtype, p.mask_type = q_data_type, kv_data_type, o_data_type, mask_type
        p.precision, p.workspace, p.workspace_bytes = precision, workspace_buffer, workspace_bytes
        self._plan = p  # published only once everything above succeeded

    def run(self, query: Tensor, kv_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, *, qo_indptr: Optional[Tensor] = None, bmm1_scale: float = 1.0, bmm2_scale: float = 1.0, out: Optional[Tensor] = None, validate: bool = True) -> Tensor:  # noqa: E501
        """Launch the planned decode on the current stream and return ``out`` (allocated when
        omitted). ``qo_indptr`` is required by a packed plan and refused by a fixed one. With
        ``validate=True`` the metadata is read back and checked first (see
        :func:`validate_mla_metadata`); kiln's host-side argument checks run on every call."""
        p = self._plan
        if p is None:
            raise NotPlannedError("kiln [not_planned]: plan() must be called before run(); call "
                                  "BatchMLADecodePagedTSWrapper.plan(...) with the static shape first")
        if validate is not True and validate is not False:
            raise TypeError("validate must be a bool")
        if p.packed:
            if qo_indptr is None:
                raise _invalid("packed-query MLA run requires qo_indptr", "qo_indptr",
                               "expected the [batch_size + 1] offsets of the packed plan, got None")
        elif qo_indptr is not None:
            raise _invalid("fixed-query MLA plan does not accept qo_indptr", "qo_indptr",
                           "expected None for a plan with packed_query=False")
        if validate:
            self._validate(p, query, kv_cache, block_tables, seq_lens, qo_indptr, out)
        if out is None:
            out = _new_tensor((*query.shape[:-1], _LATENT), p.o_dtype, query, "out")
        if is_compiling():
            _ops.mla_decode(query, kv_cache, p.workspace, _LATENT, _ROPE, block_tables, seq_lens, p.max_kv_len,
                            qo_indptr, p.max_seq_len_q, out, bmm1_scale, bmm2_scale, p.mask_type, p.o_dtype,
                            p.precision)
            return out
        try:
            _mla_native(query, kv_cache, p.workspace, _LATENT, _ROPE, block_tables, seq_lens, p.max_kv_len, qo_indptr,
                        p.max_seq_len_q, out, bmm1_scale, bmm2_scale, p.mask_type, p.o_dtype, p.precision)
        except _NeedsDispatch:
            _ops.mla_decode(query, kv_cache, p.workspace, _LATENT, _ROPE, block_tables, seq_lens, p.max_kv_len,
                            qo_indptr, p.max_seq_len_q, out, bmm1_scale, bmm2_scale, p.mask_type, p.o_dtype,
                            p.precision)
        return out

    @staticmethod
    def _validate(p: _MlaPlan, query, kv_cache, block_tables, seq_lens, qo_indptr, out) -> None:
        if not _begin_validation():
            return
        for name, t, want in (("query", query, p.q_dtype), ("kv_cache", kv_cache, p.kv_dtype),
                              ("out", out, p.o_dtype)):
            got = getattr(t, "dtype", None) if t is not None else None
            if t is not None and got is not None and _dtype_name(got) != _dtype_name(want):
                raise _invalid(f"{name} dtype must match the plan ({want}), got {got}", name,
                               f"expected dtype {want} (the plan's), got {got}")
        if _mla_page_size(kv_cache) != p.page_size:
            raise _invalid(f"kv_cache page size does not match the launch: expected {p.page_size}, got "
                           f"{_mla_page_size(kv_cache)}", "kv_cache", f"expected page_size {p.page_size} (the plan's)")
        lens = [int(v) for v in _host(seq_lens, "seq_lens")]
        if len(lens) != p.batch_size:
            raise _invalid(f"MLA metadata batch size must match the plan ({p.batch_size}), got {len(lens)}",
                           "seq_lens", f"expected {p.batch_size} entries (the plan's batch_size), got {len(lens)}")
        q_shape = _shape(query, "query")
        if p.packed:
            q_lengths = _q_lengths_from_indptr([int(v) for v in _host(qo_indptr, "qo_indptr")], p.batch_size,
                                               q_shape[0], p.max_seq_len_q)
        else:
            q_lengths = [p.max_seq_len_q] * p.batch_size
        tables = _host(block_tables, "block_tables")
        _check_mla_values(batch=p.batch_size, q_lengths=q_lengths, lens=lens, tables=tables,
                          pages=_mla_pages(kv_cache), page_size=p.page_size, bound=p.max_kv_len,
                          bound_name="max_kv_len", causal=p.mask_type == "causal")


def batch_mla_decode_with_paged_kv_cache(query: Tensor, kv_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, *, qo_indptr: Optional[Tensor] = None, max_seq_len_q: Optional[int] = None, kv_lora_rank: int = 512, qk_rope_head_dim: int = 64, mask_type: Literal['dense', 'causal'] = 'causal', max_kv_len: Optional[int] = None, bmm1_scale: float = 1.0, bmm2_scale: float = 1.0, out: Optional[Tensor] = None, out_dtype: dtype = bfloat16) -> Tensor:  # noqa: E501
    """One-shot convenience form: reads ``seq_lens`` (and ``qo_indptr``) on the host to derive the
    bounds it is not given, plans a temporary :class:`BatchMLADecodePagedTSWrapper` and runs it with
    validation. Needs torch (it allocates the workspace); never inside CUDA graph capture. Each new
    ``max_kv_len`` is a new kernel key (compiled on first use): pass a fixed ``max_kv_len`` to
    serve many calls from one kernel."""
    if not _begin_validation():
        raise InvalidArgumentError("kiln [invalid_argument]: argument 'query': batch_mla_decode_with_paged_kv_cache "
                                   "reads metadata on the host and cannot be traced; use the wrapper's "
                                   "run(validate=False) or kiln.prims_ts_batch_mla_decode_with_kv_cache")
    lens = [int(v) for v in _host(seq_lens, "seq_lens")]
    packed = qo_indptr is not None
    q_shape = _shape(query, "query")
    if packed:
        lengths = _q_lengths_from_indptr([int(v) for v in _host(qo_indptr, "qo_indptr")], len(lens), q_shape[0],
                                         None if max_seq_len_q is None else int(max_seq_len_q))
        if max_seq_len_q is None:
            max_seq_len_q = max(lengths, default=0)
            if max_seq_len_q == 0:
                raise _invalid("max_seq_len_q is required for an all-empty packed query", "max_seq_len_q",
                               "expected a value when every qo_indptr step is 0, got None")
        heads = q_shape[1]
    else:
        if len(q_shape) != 4:
            raise _invalid(f"query must have shape [B, SQ, H, {_QK}]", "query", f"expected rank 4, got {q_shape}")
        if max_seq_len_q is not None and int(max_seq_len_q) != q_shape[1]:
            raise _invalid(f"fixed query length must equal max_seq_len_q: got SQ={q_shape[1]} and "
                           f"max_seq_len_q={max_seq_len_q}", "max_seq_len_q", f"expected {q_shape[1]} or None")
        max_seq_len_q = q_shape[1]
        heads = q_shape[2]
    if any(n <= 0 for n in lens):
        bad = next(b for b, n in enumerate(lens) if n <= 0)
        raise _invalid("every runtime request must contain at least one KV token", "seq_lens",
                       f"expected values >= 1, got seq_lens[{bad}] = {lens[bad]}")
    if max_kv_len is None:
        max_kv_len = max(lens, default=1)
    wrapper = BatchMLADecodePagedTSWrapper()
    query_dtype = getattr(query, "dtype", bfloat16)
    cache_dtype = getattr(kv_cache, "dtype", query_dtype)
    wrapper.plan(_device_of(query), len(lens), heads, kv_lora_rank, qk_rope_head_dim, _mla_page_size(kv_cache),
                 int(max_kv_len), max_seq_len_q=int(max_seq_len_q), packed_query=packed, q_data_type=query_dtype,
                 kv_data_type=cache_dtype, o_data_type=out_dtype, mask_type=mask_type)
    return wrapper.run(query, kv_cache, block_tables, seq_lens, qo_indptr=qo_indptr, bmm1_scale=bmm1_scale,
                       bmm2_scale=bmm2_scale, out=out, validate=True)


def _device_of(t: Any) -> int:
    if torch is not None and isinstance(t, torch.Tensor):
        return t.device.index if t.device.index is not None else torch.cuda.current_device()
    return int(t.__dlpack_device__()[1])
