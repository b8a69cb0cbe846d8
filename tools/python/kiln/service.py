"""Warm-up, sealing, streams and the on-disk cache (prebuild, stats) of kiln's kernel service."""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Dict, Iterator, List, Literal, Optional, Sequence, Union

from . import _native
from ._torch import bfloat16, dtype

Devices = Optional[Sequence[int]]


def warm_mla(num_heads: int, page_size: int, max_seq_len: int, max_seq_len_q: int = 1, *, packed: bool = False,
             dtype: dtype = bfloat16, out_dtype: dtype = bfloat16, mask_type: Literal['dense', 'causal'] = 'causal',
             precision: Literal['exact', 'bf16'] = 'exact', devices: Devices = None) -> None:
    """Compile (or load from the cache) and load the paged MLA decode kernel of this static policy on
    each device (default: every GPU), so later launches, and CUDA graph capture, only look it up.
    ``dtype`` is the query and cache type; ``packed`` is ``qo_indptr is not None``; ``precision`` is
    the one calls will run under (:func:`kiln.mla_precision`)."""
    _native.warm_mla(int(num_heads), int(page_size), int(max_seq_len), int(max_seq_len_q), bool(packed), dtype,
                     out_dtype, mask_type, precision, _devices(devices))


def warm_sparse(num_heads: int, *, has_extra: bool = False, head_tiles: Optional[int] = None,
                split: Optional[bool] = None, devices: Devices = None) -> None:
    """Warm the sparse NVFP4 decode kernels for ``num_heads`` heads (with or without an extra cache):
    every head-tile count (1, and 2 when num_heads % 32 == 0) and both split variants, unless
    ``head_tiles`` / ``split`` name one, of every kernel the decode may pick on each device's target
    (sm_90a: mma.sync and, for H a multiple of 64 or H = 32, the warpgroup-MMA kernel; sm_120a: the
    compact one)."""
    tiles = [head_tiles] if head_tiles is not None else ([1, 2] if int(num_heads) % 32 == 0 else [1])
    splits = [split] if split is not None else [False, True]
    for t in tiles:
        for s in splits:
            _native.warm_sparse(int(num_heads), int(t), bool(has_extra), bool(s), _devices(devices))


def warm_sparse_dsv41(num_heads: int, *, has_extra: bool = False, split: Optional[bool] = None,
                      variant: Optional[str] = None, devices: Devices = None) -> None:
    """Warm the DeepSeek-V4.1 sparse decode kernels for ``num_heads`` heads (with or without the extra
    cache): both split variants unless ``split`` names one, for ``variant`` (None: the one the decode
    picks on each device's target)."""
    splits = [split] if split is not None else [False, True]
    for s in splits:
        _native.warm_sparse_dsv41(int(num_heads), bool(has_extra), bool(s), variant, _devices(devices))


def warm_nvfp4_writer(page_size: int, *, ops: Sequence[str] = ("pack", "append"), devices: Devices = None) -> None:
    """Warm the NVFP4 cache writer (``"pack"`` and/or ``"append"``) for one page size."""
    for op in _words(ops):
        _native.warm_nvfp4_writer(op, int(page_size), _devices(devices))


def warm_dsv41_writer(*, formats: Sequence[str] = ("fp8", "fp4"), ops: Sequence[str] = ("pack", "append"),
                      devices: Devices = None) -> None:
    """Warm the DeepSeek-V4.1 cache writers (``"fp8"`` / ``"fp4"``, ``"pack"`` / ``"append"``); page
    sizes and row dtypes are run-time, so these four keys serve every cache."""
    for fmt in _words(formats):
        for op in _words(ops):
            _native.warm_dsv41_writer(fmt, op, _devices(devices))


def warm_keys(keys: Sequence[str], devices: Devices = None, *, progress: bool = False) -> int:
    """Warm printable semantic keys (as in a manifest) on each device whose arch they target;
    returns the number of (key, device) pairs warmed. With ``progress``, a line per key and device
    goes to stderr as ``kiln warm`` prints it."""
    return _native.warm_keys(list(_words(keys)), _devices(devices), bool(progress))


def warm_manifest(manifest: Union[str, os.PathLike, None] = None, devices: Devices = None, *,
                  progress: bool = False) -> int:
    """Warm every key of a manifest file (default: kiln's embedded manifest), like ``kiln warm``."""
    return warm_keys(manifest_keys(manifest), devices, progress=progress)


def manifest_keys(manifest: Union[str, os.PathLike, None] = None, *, archs: Union[str, Sequence[str], None] = None) -> List[str]:
    """The printable semantic keys of a manifest file (default: kiln's embedded manifest), followed by
    their companions (the split combine and merge modules their launches also run, once each), as
    ``prebuild`` compiles them; ``archs`` selects targets: only the entries that allow one of them give
    keys (an entry without archs allows every arch)."""
    return _native.manifest_keys(_path(manifest, "manifest") or "", _archs(archs))


def prebuild(manifest: Union[str, os.PathLike, None] = None, *, archs: Union[str, Sequence[str], None] = None,
             jobs: Optional[int] = None, cache_dir: Union[str, os.PathLike, None] = None,
             progress: bool = False) -> Dict[str, Any]:
    """Compile every key of a manifest and their companions into the cache without a GPU, like
    ``kiln prebuild --json``; with ``progress``, a line per finished key goes to stderr as the CLI
    prints it (the default manifest takes about a minute on two cores).

    Returns ``{"keys": [{"key", "outcome", "ms"[, "error"]}], "companions" (how many of the keys are
    companions of the others), "compiled", "hits", "failed",
    "skipped": [{"entry", "family", "archs", "keys"}], "skipped_keys", "wall_ms", "jobs", "cache_dir",
    "writable"}``; a failed key is reported there, not raised. With ``archs``, the manifest entries
    that allow none of them are listed under ``skipped``, not compiled. A cache directory that cannot
    be opened for writing raises :class:`CacheIOError` before anything is compiled; one that stops
    taking entries during the run (a full disk) gives ``"writable": False``."""
    jobs = (os.cpu_count() or 1) if jobs is None else int(jobs)
    return json.loads(_native.prebuild(_path(manifest, "manifest") or "", _archs(archs), jobs,
                                       _path(cache_dir, "cache_dir"), bool(progress)))


def stats(cache_dir: Union[str, os.PathLike, None] = None) -> Dict[str, Any]:
    """Entries and bytes per cache layer, like ``kiln stats --json``."""
    return json.loads(_native.store_stats(_path(cache_dir, "cache_dir")))


def counters() -> Dict[str, Any]:
    """This process's kernel-service counters: memory, disk and read-only hits, compiles, loads."""
    return json.loads(_native.counters())


def seal() -> None:
    """Refuse every further compile or load (errors name the key): call after warm-up."""
    _native.seal()


def unseal() -> None:
    _native.unseal()


def sealed() -> bool:
    return _native.sealed()


@contextlib.contextmanager
def use_stream(stream: Any) -> Iterator[None]:
    """Launch kiln's kernels on ``stream`` in this thread for the scope, instead of torch's current
    stream of the tensors' device: a ``torch.cuda.Stream``, any object with ``cuda_stream`` or
    ``ptr`` (CuPy), or a raw ``CUstream`` handle as an int."""
    previous = _native.set_stream(_stream_handle(stream))
    try:
        yield
    finally:
        _native.set_stream(previous)


def _stream_handle(stream: Any) -> int:
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    if isinstance(stream, int):
        return stream
    raise TypeError(f"stream: expected a torch.cuda.Stream, an object with .ptr or an int handle, got {type(stream).__name__}")


def _devices(devices: Devices) -> Optional[List[int]]:
    return None if devices is None else [int(d) for d in devices]


def _words(value: Union[str, Sequence[str]]) -> Sequence[str]:
    """One str is one item (iterating it would give its letters)."""
    return (value,) if isinstance(value, str) else value


def _archs(archs: Union[str, Sequence[str], None]) -> Optional[str]:
    if archs is None or isinstance(archs, str):
        return archs
    try:
        items = list(archs)
    except TypeError:
        items = None
    if items is not None and all(isinstance(a, str) for a in items):
        return ",".join(items)
    raise TypeError(f"archs: expected None, a str such as 'sm_90a,sm_120a' or a sequence of str, got {archs!r}")


def _path(value: Union[str, bytes, os.PathLike, None], arg: str) -> Optional[str]:
    if value is None:
        return None
    try:
        return os.fsdecode(value)
    except TypeError:
        raise TypeError(f"{arg}: expected None, a str, bytes or os.PathLike path, got {type(value).__name__}") from None
