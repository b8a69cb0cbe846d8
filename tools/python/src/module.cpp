// kiln._native: the thin binding under the `kiln` Python package. The public functions (the seeds'
// signatures, torch custom ops) are Python, in tools/python/kiln/; this module converts arguments
// (py_tensors.h), calls the C++ API and maps kiln::Error to the package's exception classes.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <string>

#include "kiln/jit/error.h"
#include "kiln/jit/semantic_key.h"
#include "py_tensors.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/dsv41_writer/writer.h"
#include "kiln/runtime/families.h"
#include "kiln/runtime/kernel_service.h"
#include "kiln/runtime/mla_decode/launcher.h"
#include "kiln/runtime/nvfp4_writer/writer.h"
#include "kiln/runtime/sparse_dsv41/launcher.h"
#include "kiln/runtime/sparse_dsv41/planner.h"
#include "kiln/runtime/sparse_nvfp4/launcher.h"
#include "kiln/runtime/sparse_nvfp4/planner.h"
#include "kiln/runtime/validation.h"
#include "tools/cache_ops.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kiln::python {
namespace {

// kiln.errors.from_native(code, message, key, path, log) -> exception instance; set at import.
PyObject* g_error_factory = nullptr;

// Text from kiln (paths, keys, compiler logs) need not be UTF-8: undecodable bytes become U+FFFD.
PyObject* text(std::string_view s) { return PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace"); }

void raise_kiln_error(const Error& e) {
  if (g_error_factory == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return;
  }
  const ErrorDetails& d = e.details();
  PyObject* exc = PyObject_CallFunction(g_error_factory, "NNNNN", text(error_code_name(e.code())), text(e.what()),
                                        text(d.key), text(d.path), text(d.log));
  if (exc == nullptr) return;  // the factory's own error stays set
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
  Py_DECREF(exc);
}

mla::MlaPrecision precision_of(nb::handle precision) {
  if (PyUnicode_Check(precision.ptr())) {
    if (PyUnicode_CompareWithASCIIString(precision.ptr(), "exact") == 0) return mla::MlaPrecision::kExact;
    if (PyUnicode_CompareWithASCIIString(precision.ptr(), "bf16") == 0) return mla::MlaPrecision::kBf16;
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("precision: expected 'exact' or 'bf16', got {}", nb::repr(precision).c_str()));
}

mla::MaskType mask_of(nb::handle mask) {
  if (PyUnicode_Check(mask.ptr())) {
    if (PyUnicode_CompareWithASCIIString(mask.ptr(), "causal") == 0) return mla::MaskType::kCausal;
    if (PyUnicode_CompareWithASCIIString(mask.ptr(), "dense") == 0) return mla::MaskType::kDense;
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("mask_type: expected 'dense' or 'causal', got {}", nb::repr(mask).c_str()));
}

std::vector<int> device_list(const std::optional<std::vector<int>>& devices) {
  if (devices) return *devices;
  const Driver& d = Driver::get();
  d.require("list the GPUs");
  int count = 0;
  d.check(d.cuDeviceGetCount(&count), "cuDeviceGetCount");
  std::vector<int> all;
  for (int i = 0; i < count; ++i) all.push_back(i);
  return all;
}

KernelService& service_for(const std::optional<std::string>& cache_dir, std::unique_ptr<KernelService>& owned) {
  if (!cache_dir) return KernelService::global();
  Config c = Config::from_environment();
  c.cache_dir = *cache_dir;
  owned = std::make_unique<KernelService>(c);
  return *owned;
}

void mla_decode(nb::handle query, nb::handle kv_cache, nb::handle workspace, int kv_lora_rank, int qk_rope_head_dim,
                nb::handle block_tables, nb::handle seq_lens, long long max_seq_len, nb::handle qo_indptr,
                std::optional<int> max_seq_len_q, nb::handle out, double bmm1_scale, double bmm2_scale,
                nb::handle mask_type, nb::handle out_dtype, nb::handle precision) {
  TensorArgs args;
  const TensorView q = args.get(query.ptr(), "query");
  const TensorView kv = args.get(kv_cache.ptr(), "kv_cache");
  const TensorView ws = args.get(workspace.ptr(), "workspace_buffer");
  const TensorView table = args.get(block_tables.ptr(), "block_tables");
  const TensorView lens = args.get(seq_lens.ptr(), "seq_lens");
  const std::optional<TensorView> indptr = args.optional(qo_indptr.ptr(), "qo_indptr");
  const TensorView o = args.get(out.ptr(), "out");
  const mla::MaskType mask = mask_of(mask_type);
  const DType odt = dtype_of(out_dtype.ptr(), "out_dtype");
  const mla::MlaPrecision prec = precision_of(precision);
  nb::gil_scoped_release release;
  DeviceScope scope(args.device());
  mla::prims_ts_batch_decode_with_kv_cache_mla(q, kv, ws, kv_lora_rank, qk_rope_head_dim, table, lens, max_seq_len,
                                               indptr, max_seq_len_q, o, bmm1_scale, bmm2_scale, mask, odt,
                                               args.stream(), KernelService::global(), mla::MlaKernel::kAuto, prec);
}

nb::dict plan_dict(const sparse::SplitPlanResult& plan) {
  nb::dict d;
  d["head_tiles"] = plan.head_tiles;
  d["num_splits"] = plan.num_splits;
  d["chunks_per_block"] = plan.chunks_per_block;
  return d;
}

// The positional tensors and the options both sparse families share, converted in their signature's
// order (the first bad argument is the one reported).
struct SparseCallViews {
  TensorView q, kv, indices, output, out_lse;
};

SparseCallViews sparse_call_views(TensorArgs& args, sparse::SparseCallOptions& opt, nb::handle q, nb::handle kv_cache,
                                  nb::handle indices, nb::handle output, nb::handle out_lse, nb::handle topk_length,
                                  nb::handle attn_sink, nb::handle extra_kv_cache, nb::handle extra_indices,
                                  nb::handle extra_topk_length, nb::handle mid_out, nb::handle mid_lse, double lse_scale,
                                  std::optional<int> num_splits, int max_splits, std::optional<int> head_tiles) {
  SparseCallViews v{args.get(q.ptr(), "q"), args.get(kv_cache.ptr(), "kv_cache"), args.get(indices.ptr(), "indices"),
                    args.get(output.ptr(), "output"), args.get(out_lse.ptr(), "out_lse")};
  opt.topk_length = args.optional(topk_length.ptr(), "topk_length");
  opt.attn_sink = args.optional(attn_sink.ptr(), "attn_sink");
  opt.extra_kv_cache = args.optional(extra_kv_cache.ptr(), "extra_kv_cache");
  opt.extra_indices = args.optional(extra_indices.ptr(), "extra_indices");
  opt.extra_topk_length = args.optional(extra_topk_length.ptr(), "extra_topk_length");
  opt.mid_out = args.optional(mid_out.ptr(), "mid_out");
  opt.mid_lse = args.optional(mid_lse.ptr(), "mid_lse");
  opt.lse_scale = lse_scale;
  opt.num_splits = num_splits;
  opt.max_splits = max_splits;
  opt.head_tiles = head_tiles;
  return v;
}

nb::dict sparse_decode(nb::handle q, nb::handle kv_cache, nb::handle indices, nb::handle output, nb::handle out_lse,
                       double sm_scale, nb::handle topk_length, nb::handle attn_sink, nb::handle extra_kv_cache,
                       nb::handle extra_indices, nb::handle extra_topk_length, nb::handle mid_out, nb::handle mid_lse,
                       double lse_scale, std::optional<int> num_splits, int max_splits, std::optional<int> head_tiles) {
  TensorArgs args;
  sparse::SparseOptions opt;
  const SparseCallViews v = sparse_call_views(args, opt, q, kv_cache, indices, output, out_lse, topk_length, attn_sink,
                                              extra_kv_cache, extra_indices, extra_topk_length, mid_out, mid_lse,
                                              lse_scale, num_splits, max_splits, head_tiles);
  sparse::SplitPlanResult plan;
  {
    nb::gil_scoped_release release;
    DeviceScope scope(args.device());
    plan = sparse::cake_sparse_mla_sm120_dsv4_nvfp4_decode(v.q, v.kv, v.indices, v.output, v.out_lse, sm_scale, opt,
                                                           args.stream());
  }
  return plan_dict(plan);
}

nb::dict dsv41_plan_dict(const dsv41::Dsv41Plan& plan) {
  nb::dict d;
  d["variant"] = dsv41::dsv41_variant_name(plan.variant);
  d["head_tiles"] = plan.head_tiles;
  d["num_splits"] = plan.num_splits;
  d["chunks_per_block"] = plan.chunks_per_block;
  d["precision"] = plan.precision;
  return d;
}

// A str argument as a view of Python's own UTF-8 (no copy); anything else is refused naming `arg`.
std::string_view str_arg(nb::handle value, const char* arg, const char* expected) {
  if (PyUnicode_Check(value.ptr())) {
    Py_ssize_t size = 0;
    if (const char* utf8 = PyUnicode_AsUTF8AndSize(value.ptr(), &size)) return {utf8, static_cast<std::size_t>(size)};
    PyErr_Clear();
  }
  throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: expected {}, got {}", arg, expected, nb::repr(value).c_str()));
}

nb::dict dsv41_decode(nb::handle q, nb::handle kv_cache, nb::handle indices, nb::handle output, nb::handle out_lse,
                      double sm_scale, nb::handle topk_length, nb::handle attn_sink, nb::handle extra_kv_cache,
                      nb::handle extra_indices, nb::handle extra_topk_length, nb::handle mid_out, nb::handle mid_lse,
                      double lse_scale, std::optional<int> num_splits, int max_splits, std::optional<int> head_tiles,
                      nb::handle variant, nb::handle compute_precision, std::optional<bool> enable_pdl) {
  dsv41::Dsv41Options opt;
  if (!variant.is_none()) opt.variant = str_arg(variant, "variant", "None or a str in format_info()['variants']");
  opt.compute_precision = str_arg(compute_precision, "compute_precision", "'default' or 'bf16'");
  TensorArgs args;
  const SparseCallViews v = sparse_call_views(args, opt, q, kv_cache, indices, output, out_lse, topk_length, attn_sink,
                                              extra_kv_cache, extra_indices, extra_topk_length, mid_out, mid_lse,
                                              lse_scale, num_splits, max_splits, head_tiles);
  opt.enable_pdl = enable_pdl;
  dsv41::Dsv41Plan plan;
  {
    nb::gil_scoped_release release;
    DeviceScope scope(args.device());
    plan = dsv41::cake_sparse_mla_sm120_dsv41_mixed_decode(v.q, v.kv, v.indices, v.output, v.out_lse, sm_scale, opt,
                                                         args.stream());
  }
  return dsv41_plan_dict(plan);
}

// Whether kiln serves the DSv4.1 decode on `device`: an sm_90a or sm_120a GPU (false without a driver).
bool dsv41_kernels_available(int device) {
  try {
    const std::string& arch = KernelService::global().device_arch(device);
    return arch == "sm_90a" || arch == "sm_120a";
  } catch (const Error&) {
    return false;
  }
}

void nvfp4_pack(nb::handle latent, nb::handle cache) {
  TensorArgs args;
  const TensorView l = args.get(latent.ptr(), "latent");
  const TensorView c = args.get(cache.ptr(), "cache");
  nb::gil_scoped_release release;
  DeviceScope scope(args.device());
  nvfp4::pack(l, c, args.stream());
}

void nvfp4_append(nb::handle rows, nb::handle slot_mapping, nb::handle cache) {
  TensorArgs args;
  const TensorView r = args.get(rows.ptr(), "rows");
  const TensorView s = args.get(slot_mapping.ptr(), "slot_mapping");
  const TensorView c = args.get(cache.ptr(), "cache");
  nb::gil_scoped_release release;
  DeviceScope scope(args.device());
  nvfp4::append(r, s, c, args.stream());
}

dsv41::CacheFormat dsv41_format_of(const std::string& format) {
  if (format == "fp8") return dsv41::CacheFormat::kFp8;
  if (format == "fp4") return dsv41::CacheFormat::kFp4;
  throw Error(ErrorCode::kInvalidArgument, fmt::format("format: expected 'fp8' or 'fp4', got '{}'", format));
}

// The uint8 cache shape pack() fills for this latent and layout; checks both first.
std::tuple<long long, long long, long long, long long> dsv41_pack_shape(const std::string& format, nb::handle latent_kv,
                                                                       const std::string& kv_layout) {
  const dsv41::CacheFormat f = dsv41_format_of(format);
  const dsv41::KvLayout layout = dsv41::parse_kv_layout(kv_layout);
  TensorArgs args;
  const TensorView l = args.get(latent_kv.ptr(), "latent_kv");
  const auto shape = dsv41::pack_cache_shape(f, l, layout);
  return {shape[0], shape[1], shape[2], shape[3]};
}

void dsv41_pack(const std::string& format, nb::handle latent_kv, nb::handle cache) {
  const dsv41::CacheFormat f = dsv41_format_of(format);
  TensorArgs args;
  const TensorView l = args.get(latent_kv.ptr(), "latent_kv");
  const TensorView c = args.get(cache.ptr(), "cache");
  nb::gil_scoped_release release;
  DeviceScope scope(args.device());
  dsv41::pack(f, l, c, args.stream());
}

void dsv41_append(const std::string& format, nb::handle latent_kv, nb::handle slot_mapping, nb::handle cache) {
  const dsv41::CacheFormat f = dsv41_format_of(format);
  TensorArgs args;
  const TensorView l = args.get(latent_kv.ptr(), "latent_kv");
  const TensorView s = args.get(slot_mapping.ptr(), "slot_mapping");
  const TensorView c = args.get(cache.ptr(), "cache");
  nb::gil_scoped_release release;
  DeviceScope scope(args.device());
  dsv41::append(f, l, s, c, args.stream());
}

mla::MlaDecodePolicy mla_policy(int heads, int page_size, long long max_seq_len, int max_seq_len_q, bool packed,
                                nb::handle dtype, nb::handle out_dtype, nb::handle mask_type,
                                mla::MlaPrecision precision = mla::MlaPrecision::kExact) {
  return mla::MlaDecodePolicy{heads,     page_size, max_seq_len, max_seq_len_q, packed, dtype_of(dtype.ptr(), "dtype"),
                              dtype_of(out_dtype.ptr(), "out_dtype"), mask_of(mask_type), mla::MlaKernel::kAuto,
                              precision};
}

// Seconds of `iterations` back-to-back `call()`s, with the GIL released and the tensors' device current.
template <typename Call>
double seconds_of_calls(const TensorArgs& args, int iterations, Call&& call) {
  nb::gil_scoped_release release;
  DeviceScope scope(args.device());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) call();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Host time of `iterations` back-to-back launches with these arguments (MLA: page-table decode with
// default scales and causal mask; sparse: sm_scale 0.04, one split), measured in C++: the baseline
// that kiln.bench reports the Python entry points' overhead against.
double time_mla_cpp(nb::handle query, nb::handle kv_cache, nb::handle workspace, nb::handle block_tables,
                    nb::handle seq_lens, long long max_seq_len, nb::handle out, int iterations) {
  TensorArgs args;
  const TensorView q = args.get(query.ptr(), "query");
  const TensorView kv = args.get(kv_cache.ptr(), "kv_cache");
  const TensorView ws = args.get(workspace.ptr(), "workspace_buffer");
  const TensorView table = args.get(block_tables.ptr(), "block_tables");
  const TensorView lens = args.get(seq_lens.ptr(), "seq_lens");
  const TensorView o = args.get(out.ptr(), "out");
  return seconds_of_calls(args, iterations, [&] {
    mla::prims_ts_batch_decode_with_kv_cache_mla(q, kv, ws, 512, 64, table, lens, max_seq_len, std::nullopt,
                                                 std::nullopt, o, 1.0, 1.0, mla::MaskType::kCausal, DType::kBf16,
                                                 args.stream());
  });
}

double time_sparse_cpp(nb::handle q, nb::handle kv_cache, nb::handle indices, nb::handle output, nb::handle out_lse,
                       int iterations) {
  TensorArgs args;
  const TensorView qv = args.get(q.ptr(), "q");
  const TensorView kv = args.get(kv_cache.ptr(), "kv_cache");
  const TensorView idx = args.get(indices.ptr(), "indices");
  const TensorView o = args.get(output.ptr(), "output");
  const TensorView lse = args.get(out_lse.ptr(), "out_lse");
  sparse::SparseOptions opt;
  opt.num_splits = 1;
  return seconds_of_calls(args, iterations,
                          [&] { sparse::cake_sparse_mla_sm120_dsv4_nvfp4_decode(qv, kv, idx, o, lse, 0.04, opt, args.stream()); });
}

}  // namespace
}  // namespace kiln::python

NB_MODULE(_native, m) {
  using namespace kiln;
  using namespace kiln::python;

  register_builtin_families();  // manifests and keys name them before any service exists
  nb::exception<NeedsDispatch>(m, "NeedsDispatch");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      raise_kiln_error(e);
    }
  });

  m.def("set_error_factory", [](nb::handle f) { g_error_factory = Py_NewRef(f.ptr()); });
  m.def("init_torch", [](nb::handle torch) { init_torch(torch.ptr()); });
  m.def("set_stream", [](std::optional<std::uintptr_t> handle) {
    const std::optional<CUstream> previous = thread_stream();
    set_thread_stream(handle ? std::optional<CUstream>(reinterpret_cast<CUstream>(*handle)) : std::nullopt);
    return previous ? std::optional<std::uintptr_t>(reinterpret_cast<std::uintptr_t>(*previous)) : std::nullopt;
  }, "handle"_a.none());

  // Optional tensors and integers take None (nanobind refuses None for an argument unless told).
  m.def("mla_decode", &mla_decode, "query"_a, "kv_cache"_a, "workspace"_a, "kv_lora_rank"_a, "qk_rope_head_dim"_a,
        "block_tables"_a, "seq_lens"_a, "max_seq_len"_a, "qo_indptr"_a.none(), "max_seq_len_q"_a.none(), "out"_a,
        "bmm1_scale"_a, "bmm2_scale"_a, "mask_type"_a, "out_dtype"_a, "precision"_a);
  m.def("sparse_decode", &sparse_decode, "q"_a, "kv_cache"_a, "indices"_a, "output"_a, "out_lse"_a, "sm_scale"_a,
        "topk_length"_a.none(), "attn_sink"_a.none(), "extra_kv_cache"_a.none(), "extra_indices"_a.none(),
        "extra_topk_length"_a.none(), "mid_out"_a.none(), "mid_lse"_a.none(), "lse_scale"_a, "num_splits"_a.none(),
        "max_splits"_a, "head_tiles"_a.none());
  m.def("nvfp4_pack", &nvfp4_pack);
  m.def("nvfp4_append", &nvfp4_append);
  m.def("dsv41_pack_shape", &dsv41_pack_shape);
  m.def("dsv41_pack", &dsv41_pack);
  m.def("dsv41_append", &dsv41_append);
  m.def("time_mla_cpp", &time_mla_cpp);
  m.def("time_sparse_cpp", &time_sparse_cpp);

  m.def("mla_workspace_size", [](int heads, int page_size, long long max_seq_len, int max_seq_len_q, bool packed,
                                 nb::handle dtype, nb::handle out_dtype, nb::handle mask_type, int batch) {
    return mla::mla_workspace_size(mla_policy(heads, page_size, max_seq_len, max_seq_len_q, packed, dtype, out_dtype, mask_type),
                                   batch);
  });
  m.def("sparse_num_chunks", &sparse::num_chunks);
  m.def("sparse_scratch_bytes", &sparse::scratch_bytes);
  m.def("sparse_plan_head_tiles", &sparse::plan_head_tiles);
  m.def("sparse_plan_splits", [](int tokens, int heads, int topk, int extra_topk, int sms, int max_splits, int head_tiles) {
    const sparse::SplitPlan p = sparse::plan_splits(tokens, heads, topk, extra_topk, sms, max_splits, head_tiles);
    return std::make_tuple(p.num_splits, p.chunks_per_block);
  });
  m.def("sparse_resolve_plan", [](int tokens, int heads, int topk, int extra_topk, int sms, std::optional<int> num_splits,
                                  int max_splits, std::optional<int> head_tiles) {
    return plan_dict(sparse::resolve_plan(tokens, heads, topk, extra_topk, sms, num_splits, max_splits, head_tiles));
  }, "tokens"_a, "heads"_a, "topk"_a, "extra_topk"_a, "sms"_a, "num_splits"_a.none(), "max_splits"_a, "head_tiles"_a.none());
  m.def("dsv41_decode", &dsv41_decode, "q"_a, "kv_cache"_a, "indices"_a, "output"_a, "out_lse"_a, "sm_scale"_a,
        "topk_length"_a.none(), "attn_sink"_a.none(), "extra_kv_cache"_a.none(), "extra_indices"_a.none(),
        "extra_topk_length"_a.none(), "mid_out"_a.none(), "mid_lse"_a.none(), "lse_scale"_a, "num_splits"_a.none(),
        "max_splits"_a, "head_tiles"_a.none(), "variant"_a.none(), "compute_precision"_a.none(), "enable_pdl"_a.none());
  m.def("dsv41_num_chunks", &dsv41::num_chunks);
  m.def("dsv41_scratch_bytes", &dsv41::scratch_bytes);
  m.def("dsv41_plan_head_tiles", &dsv41::plan_head_tiles);
  m.def("dsv41_plan_splits", [](int tokens, int heads, int topk, int extra_topk, int sms, int max_splits, int head_tiles,
                                bool unified_memory, bool ragged) {
    const sparse::SplitPlan p =
        dsv41::plan_splits(tokens, heads, topk, extra_topk, sms, dsv41::SplitOptions{max_splits, head_tiles, unified_memory, ragged});
    return std::make_tuple(p.num_splits, p.chunks_per_block);
  });
  m.def("dsv41_supported_heads", [] { return std::vector<int>(dsv41::supported_heads().begin(), dsv41::supported_heads().end()); });
  m.def("dsv41_two_tile_heads", [] { return std::vector<int>(dsv41::two_tile_heads().begin(), dsv41::two_tile_heads().end()); });
  m.def("dsv41_variants", [] {
    return std::vector<std::string>{dsv41::dsv41_variant_name(dsv41::Dsv41Variant::kDefault),
                                    dsv41::dsv41_variant_name(dsv41::Dsv41Variant::kSm90)};
  });
  m.def("dsv41_kernels_available", &dsv41_kernels_available);
  // The launcher's plan for a call of these shapes on `device` (traced and profiled calls).
  m.def("dsv41_resolve_plan", [](int tokens, int heads, int topk, int extra_topk, int device, std::optional<int> num_splits,
                                 int max_splits, std::optional<int> head_tiles, std::optional<std::string> variant, bool ragged) {
    const sparse::SparseDevice gpu = sparse::sparse_device(KernelService::global(), device);
    const dsv41::Dsv41Device target{gpu.arch, gpu.sms, false, gpu.residency};
    dsv41::Dsv41Options opt;
    if (variant) opt.variant = *variant;
    opt.num_splits = num_splits;
    opt.max_splits = max_splits;
    opt.head_tiles = head_tiles;
    return dsv41_plan_dict(dsv41::resolve_dsv41_plan(tokens, heads, topk, extra_topk, target, opt, ragged));
  }, "tokens"_a, "heads"_a, "topk"_a, "extra_topk"_a, "device"_a, "num_splits"_a.none(), "max_splits"_a, "head_tiles"_a.none(),
     "variant"_a.none(), "ragged"_a);
  m.def("device_sm_count", [](int device) { return KernelService::global().device_sm_count(device); });

  m.def("warm_mla", [](int heads, int page_size, long long max_seq_len, int max_seq_len_q, bool packed, nb::handle dtype,
                       nb::handle out_dtype, nb::handle mask_type, nb::handle precision,
                       std::optional<std::vector<int>> devices) {
    const mla::MlaDecodePolicy policy = mla_policy(heads, page_size, max_seq_len, max_seq_len_q, packed, dtype, out_dtype,
                                                   mask_type, precision_of(precision));
    policy.validate();  // bad input is reported as such on a machine without a GPU too
    const std::vector<int> list = device_list(devices);
    nb::gil_scoped_release release;
    mla::warm_mla(policy, list);
  }, "heads"_a, "page_size"_a, "max_seq_len"_a, "max_seq_len_q"_a, "packed"_a, "dtype"_a, "out_dtype"_a, "mask_type"_a,
     "precision"_a, "devices"_a.none());
  m.def("warm_sparse", [](int heads, int head_tiles, bool has_extra, bool split, std::optional<std::vector<int>> devices) {
    const sparse::SparsePolicy policy{heads, head_tiles, has_extra, split};
    policy.validate();
    const std::vector<int> list = device_list(devices);
    nb::gil_scoped_release release;
    KernelService& service = KernelService::global();
    for (int device : list) {
      // Every kernel the launcher may pick on this device's target; all but mma.sync map a plan onto
      // their own blocks, so their keys carry head_tiles 1.
      for (const sparse::SparseKernel kernel : sparse::sparse_kernels_for(service.device_arch(device), heads)) {
        sparse::SparsePolicy p = policy;
        p.kernel = kernel;
        if (kernel != sparse::SparseKernel::kMma) p.head_tiles = 1;
        sparse::warm_sparse(p, {device}, service);
      }
    }
  }, "heads"_a, "head_tiles"_a, "has_extra"_a, "split"_a, "devices"_a.none());
  m.def("warm_sparse_dsv41", [](int heads, bool has_extra, bool split, std::optional<std::string> variant,
                                std::optional<std::vector<int>> devices) {
    dsv41::Dsv41Policy{heads, has_extra, split}.validate();  // the variant depends on each device's target
    const std::vector<int> list = device_list(devices);
    nb::gil_scoped_release release;
    KernelService& service = KernelService::global();
    for (int device : list) {
      // None: every variant the launcher may pick on this device's target.
      const std::optional<std::string_view> requested = variant ? std::optional<std::string_view>(*variant) : std::nullopt;
      const std::string& arch = service.device_arch(device);
      const std::optional<dsv41::Dsv41Variant> pinned = dsv41::resolve_variant(arch, heads, requested);
      for (const dsv41::Dsv41Variant v : pinned ? std::vector{*pinned} : dsv41::dsv41_variants_for(arch, heads)) {
        dsv41::warm_sparse_dsv41(dsv41::Dsv41Policy{heads, has_extra, split, v}, {device}, service);
      }
    }
  }, "heads"_a, "has_extra"_a, "split"_a, "variant"_a.none(), "devices"_a.none());
  m.def("warm_nvfp4_writer", [](const std::string& op, int page_size, std::optional<std::vector<int>> devices) {
    if (op != "pack" && op != "append") {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("op: expected 'pack' or 'append', got '{}'", op));
    }
    const nvfp4::WriterPolicy policy{op == "pack" ? nvfp4::WriterOp::kPack : nvfp4::WriterOp::kAppend, page_size};
    policy.validate();
    const std::vector<int> list = device_list(devices);
    nb::gil_scoped_release release;
    nvfp4::warm(policy, list);
  }, "op"_a, "page_size"_a, "devices"_a.none());
  m.def("warm_dsv41_writer", [](const std::string& format, const std::string& op, std::optional<std::vector<int>> devices) {
    const dsv41::CacheFormat f = dsv41_format_of(format);
    if (op != "pack" && op != "append") {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("op: expected 'pack' or 'append', got '{}'", op));
    }
    const std::vector<int> list = device_list(devices);
    nb::gil_scoped_release release;
    dsv41::warm({f, op == "pack" ? dsv41::WriterOp::kPack : dsv41::WriterOp::kAppend}, list);
  }, "format"_a, "op"_a, "devices"_a.none());
  m.def("warm_keys", [](const std::vector<std::string>& keys, std::optional<std::vector<int>> devices, bool progress) {
    std::vector<SemanticKey> parsed;
    for (const std::string& k : keys) parsed.push_back(SemanticKey::parse(k));
    const std::vector<int> list = device_list(devices);
    nb::gil_scoped_release release;
    std::size_t warmed = 0;
    for (std::size_t n : tools::warm_on_devices(KernelService::global(), parsed, list,
                                                progress ? tools::print_warm_progress : KernelService::WarmProgress{})) {
      warmed += n;
    }
    return warmed;
  }, "keys"_a, "devices"_a.none(), "progress"_a);

  m.def("manifest_keys", [](const std::string& manifest, std::optional<std::string> archs) {
    std::vector<std::string> out;
    for (const SemanticKey& k : tools::manifest_keys(manifest, archs)) out.push_back(k.str());
    return out;
  }, "manifest"_a, "archs"_a.none());
  m.def("prebuild", [](const std::string& manifest, std::optional<std::string> archs, int jobs, std::optional<std::string> cache_dir,
                       bool progress) {
    const ManifestSelection selection = tools::manifest_selection(manifest, archs);
    nb::gil_scoped_release release;
    std::unique_ptr<KernelService> owned;
    KernelService& service = service_for(cache_dir, owned);
    const auto start = std::chrono::steady_clock::now();
    const auto outcomes = tools::prebuild(service, selection.keys, jobs, progress ? tools::print_prebuild_progress : nullptr);
    const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return tools::prebuild_report(service, selection, outcomes, wall, jobs).dump();
  }, "manifest"_a, "archs"_a.none(), "jobs"_a, "cache_dir"_a.none(), "progress"_a);
  m.def("store_stats", [](std::optional<std::string> cache_dir) {
    std::unique_ptr<KernelService> owned;
    return tools::store_stats(service_for(cache_dir, owned)).dump();
  }, "cache_dir"_a.none());
  m.def("counters", [] { return KernelService::global().counters().to_json().dump(); });
  m.def("seal", [] { KernelService::global().seal(); });
  m.def("unseal", [] { KernelService::global().unseal(); });
  m.def("sealed", [] { return KernelService::global().sealed(); });
}
