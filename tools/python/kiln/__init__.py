"""kiln: a runtime JIT compilation service for specialised CUDA kernels.

The decode entry points have FlashInfer's exact signatures and run kiln's NVRTC-compiled kernels:

    prims_ts_batch_decode_with_kv_cache_mla   paged MLA decode (Hopper); upstream's newer name
                                              prims_ts_batch_mla_decode_with_kv_cache and its
                                              plan/run BatchMLADecodePagedTSWrapper are here too
    cake_sparse_mla_sm120_dsv4_nvfp4_decode   sparse MLA decode over the NVFP4 cache
    cake_sparse_mla_sm120_dsv41_mixed_decode  sparse MLA decode over DeepSeek-V4.1's FP8 + FP4 caches

Each is also a torch custom op (torch.ops.kiln.*) when torch is installed, so torch.compile traces it
and CUDA graphs capture it. Warm the kernels you will launch before capturing (warm_mla, warm_sparse,
warm_sparse_dsv41, warm_nvfp4_writer, warm_manifest), then optionally seal(). Errors are kiln.Error subclasses.
"""
from . import errors
from ._torch import torch as _torch_module
from .decode import (
    cake_sparse_mla_sm120_dsv4_nvfp4_decode,
    cake_sparse_mla_sm120_dsv4_nvfp4_format_info,
    cake_sparse_mla_sm120_dsv4_nvfp4_num_chunks,
    cake_sparse_mla_sm120_dsv4_nvfp4_plan_head_tiles,
    cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits,
    cake_sparse_mla_sm120_dsv4_nvfp4_scratch_bytes,
    cake_sparse_mla_sm120_dsv4_nvfp4_supported_heads,
    mla_precision,
    mla_workspace_size,
    prims_ts_batch_decode_with_kv_cache_mla,
)
from .dsv41 import (
    cake_sparse_mla_sm120_dsv41_mixed_decode,
    cake_sparse_mla_sm120_dsv41_mixed_format_info,
    cake_sparse_mla_sm120_dsv41_mixed_num_chunks,
    cake_sparse_mla_sm120_dsv41_mixed_plan_head_tiles,
    cake_sparse_mla_sm120_dsv41_mixed_plan_splits,
    cake_sparse_mla_sm120_dsv41_mixed_scratch_bytes,
    cake_sparse_mla_sm120_dsv41_mixed_supported_heads,
)
from .errors import (
    CacheCorruptError,
    CacheIOError,
    CompileError,
    DriverError,
    Error,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    NotPlannedError,
    NotWarmError,
    SealedError,
    UnsupportedError,
)
from .service import (
    counters,
    manifest_keys,
    prebuild,
    seal,
    sealed,
    stats,
    unseal,
    use_stream,
    warm_keys,
    warm_manifest,
    warm_mla,
    warm_nvfp4_writer,
    warm_sparse,
    warm_sparse_dsv41,
)
from .prims_ts import (
    BatchMLADecodePagedTSWrapper,
    batch_mla_decode_with_paged_kv_cache,
    get_prims_ts_batch_decode_mla_workspace_size,
    get_prims_ts_batch_mla_decode_workspace_size,
    prims_ts_batch_mla_decode_with_kv_cache,
    validate_mla_metadata,
    validate_sparse_metadata,
)
from .writer import nvfp4_append, nvfp4_pack

from . import _native

_native.set_error_factory(errors.from_native)

__version__ = "0.1.0"
HAS_TORCH = _torch_module is not None

__all__ = [
    "prims_ts_batch_decode_with_kv_cache_mla",
    "prims_ts_batch_mla_decode_with_kv_cache",
    "get_prims_ts_batch_mla_decode_workspace_size",
    "get_prims_ts_batch_decode_mla_workspace_size",
    "BatchMLADecodePagedTSWrapper",
    "batch_mla_decode_with_paged_kv_cache",
    "validate_mla_metadata",
    "validate_sparse_metadata",
    "cake_sparse_mla_sm120_dsv4_nvfp4_format_info",
    "cake_sparse_mla_sm120_dsv4_nvfp4_supported_heads",
    "cake_sparse_mla_sm120_dsv4_nvfp4_decode",
    "cake_sparse_mla_sm120_dsv4_nvfp4_num_chunks",
    "cake_sparse_mla_sm120_dsv4_nvfp4_plan_head_tiles",
    "cake_sparse_mla_sm120_dsv4_nvfp4_plan_splits",
    "cake_sparse_mla_sm120_dsv4_nvfp4_scratch_bytes",
    "cake_sparse_mla_sm120_dsv41_mixed_decode",
    "cake_sparse_mla_sm120_dsv41_mixed_format_info",
    "cake_sparse_mla_sm120_dsv41_mixed_num_chunks",
    "cake_sparse_mla_sm120_dsv41_mixed_plan_head_tiles",
    "cake_sparse_mla_sm120_dsv41_mixed_plan_splits",
    "cake_sparse_mla_sm120_dsv41_mixed_scratch_bytes",
    "cake_sparse_mla_sm120_dsv41_mixed_supported_heads",
    "mla_precision",
    "mla_workspace_size",
    "nvfp4_pack",
    "nvfp4_append",
    "warm_mla",
    "warm_sparse",
    "warm_sparse_dsv41",
    "warm_nvfp4_writer",
    "warm_keys",
    "warm_manifest",
    "manifest_keys",
    "prebuild",
    "stats",
    "counters",
    "seal",
    "unseal",
    "sealed",
    "use_stream",
    "Error",
    "InvalidArgumentError",
    "UnsupportedError",
    "CompileError",
    "CacheCorruptError",
    "CacheIOError",
    "DriverError",
    "NotWarmError",
    "SealedError",
    "NotFoundError",
    "NotPlannedError",
    "InternalError",
    "HAS_TORCH",
]
