"""`python -m kiln.bench [--out FILE]`: host time per call of the Python entry points against kiln's C++
launchers on the same arguments (a warm key, outputs given), on GPU 0. Needs torch and a GPU.

Each round times `calls` back-to-back launches of every path in turn (the C++ launcher loop, the
Python entry point, the torch op), rotating which goes first, with the stream synchronized between
paths, untimed; a round enqueues far less than the GPU's launch queue holds, so the host, not the GPU,
sets the pace. Host speed drifts between rounds by more than the differences measured, so the
overhead is the median over rounds of (Python - C++) within a round, with its quartiles; each path's
figure is its median over rounds."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import time

import torch

import kiln
from kiln import _native


def _interleaved(paths: dict, calls: int, rounds: int) -> dict:
    """Per-call host microseconds of each path in `paths` (name -> fn(n) making n calls), timed in the
    same rounds; plus the overhead of "python_us" over "cpp_us" as the median of per-round differences."""
    names = list(paths)
    samples = {name: [] for name in names}
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            torch.cuda.synchronize()
            start = time.perf_counter()
            paths[name](calls)
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    out = {name: statistics.median(v) for name, v in samples.items()}
    diffs = [py - cpp for py, cpp in zip(samples["python_us"], samples["cpp_us"])]
    q = statistics.quantiles(diffs, n=4)
    out["overhead_us"] = statistics.median(diffs)
    out["overhead_quartiles_us"] = [q[0], q[2]]
    return out


def _loop(call):
    def run(n):
        for _ in range(n):
            call()
    return run


def _pin_near_gpu(index: int) -> str:
    """Keeps this process on the CPUs of GPU `index`'s NUMA node (launch calls reach the GPU over its
    PCIe root); returns the CPU list, or why the process was left where it was."""
    props = torch.cuda.get_device_properties(index)
    bdf = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    try:
        with open(f"/sys/bus/pci/devices/{bdf}/local_cpulist") as f:
            text = f.read().strip()
        cpus = set()
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
        os.sched_setaffinity(0, cpus & os.sched_getaffinity(0) or os.sched_getaffinity(0))
        return text
    except (OSError, ValueError) as e:
        return f"not pinned ({e})"


def measure(calls: int = 100, rounds: int = 200) -> dict:
    dev = torch.device("cuda", 0)
    cpus = _pin_near_gpu(0)
    # Paged MLA decode: one request, 1024 tokens of a 16-head, page-64 cache.
    H, page, max_seq_len = 16, 64, 1024
    q = torch.randn(1, 1, H, 576, device=dev).bfloat16()
    kv = torch.randn(max_seq_len // page, page, 576, device=dev).bfloat16()
    ws = torch.empty(kiln.mla_workspace_size(H, page, max_seq_len, 1, 1), dtype=torch.uint8, device=dev)
    tables = torch.arange(max_seq_len // page, dtype=torch.int32, device=dev)[None]
    lens = torch.full((1,), max_seq_len, dtype=torch.int32, device=dev)
    out = torch.empty(1, 1, H, 512, dtype=torch.bfloat16, device=dev)
    kiln.warm_mla(H, page, max_seq_len, 1, devices=[0])
    decode = kiln.prims_ts_batch_decode_with_kv_cache_mla
    op = torch.ops.kiln.mla_decode.default
    wrapper = kiln.BatchMLADecodePagedTSWrapper()
    wrapper.plan(0, 1, H, 512, 64, page, max_seq_len, max_seq_len_q=1, packed_query=False, q_data_type=torch.bfloat16,
                 kv_data_type=torch.bfloat16, o_data_type=torch.bfloat16, workspace_buffer=ws)
    mla = _interleaved({
        "cpp_us": lambda n: _native.time_mla_cpp(q, kv, ws, tables, lens, max_seq_len, out, n),
        "python_us": _loop(lambda: decode(q, kv, ws, 512, 64, tables, lens, max_seq_len, out=out)),
        "wrapper_run_us": _loop(lambda: wrapper.run(q, kv, tables, lens, out=out, validate=False)),
        "torch_ops_us": _loop(lambda: op(q, kv, ws, 512, 64, tables, lens, max_seq_len, None, None, out, 1.0, 1.0,
                                         "causal", torch.bfloat16, "exact")),
    }, calls, rounds)
    # Sparse NVFP4 decode: one token, 64 heads, 512 candidates.
    T, Hs, topk = 1, 64, 512
    sq = torch.randn(T, Hs, 512, device=dev).bfloat16()
    cache = kiln.nvfp4_pack(torch.randn(16, 64, 512, device=dev).bfloat16())
    idx = torch.randint(0, 16 * 64, (T, topk), dtype=torch.int32, device=dev)
    output = torch.empty(T, Hs, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(T, Hs, dtype=torch.float32, device=dev)
    plan = kiln.cake_sparse_mla_sm120_dsv4_nvfp4_decode(sq, cache, idx, output, lse, 0.04, num_splits=1)
    sparse_decode = kiln.cake_sparse_mla_sm120_dsv4_nvfp4_decode
    sop = torch.ops.kiln.sparse_decode.default
    sparse = _interleaved({
        "cpp_us": lambda n: _native.time_sparse_cpp(sq, cache, idx, output, lse, n),
        "python_us": _loop(lambda: sparse_decode(sq, cache, idx, output, lse, 0.04, num_splits=1)),
        "torch_ops_us": _loop(lambda: sop(sq, cache, idx, output, lse, 0.04, None, None, None, None, None, None, None,
                                          1.0, 1, 16, None)),
    }, calls, rounds)
    sparse["plan"] = plan
    return {"what": "host time per call: Python entry point vs kiln's C++ launcher (warm key, outputs given)",
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "exchange_api": hasattr(torch.Tensor, "__dlpack_c_exchange_api__"),
            "cpus": cpus, "calls_per_round": calls, "rounds": rounds, "timing": "interleaved rounds; overhead = median of per-round differences", "mla": mla, "sparse": sparse}


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the JSON report here")
    parser.add_argument("--commit", default="unknown", help="the kiln commit the package was built from")
    args = parser.parse_args()
    report = {"commit": args.commit, "driver": _driver_version(), **measure()}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
