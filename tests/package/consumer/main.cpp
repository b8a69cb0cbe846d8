// Uses kiln's public headers the way an engine does, on a machine without a GPU: the workspace and
// planner helpers, and a launch whose arguments kiln rejects on the host before any driver call.
#include <kiln/jit/error.h>
#include <kiln/runtime/mla_decode/launcher.h>
#include <kiln/runtime/sparse_nvfp4/planner.h>

#include <cstdio>

int main() {
  using namespace kiln;
  int failures = 0;
  const auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "consumer: %s\n", what);
      ++failures;
    }
  };

  // 2048 + 128 candidates are 32 + 2 chunks of 64.
  expect(sparse::num_chunks(2048, 128) == 34, "num_chunks(2048, 128) != 34");
  // A single-request decode may split, so it needs a workspace; its size does not depend on a GPU.
  const std::size_t ws = mla::mla_workspace_size(16, 64, 163840, 1, false, DType::kBf16, DType::kBf16,
                                                 mla::MaskType::kCausal, 1);
  expect(ws > 0, "mla_workspace_size for B = 1 is 0");

  // A float32 query is refused by name, as kiln::Error with code invalid_argument.
  alignas(64) static unsigned char fake[64];
  const TensorView query = TensorView::contiguous(fake, DType::kF32, {1, 1, 16, 576});
  const TensorView cache = TensorView::contiguous(fake, DType::kBf16, {1, 64, 576});
  const TensorView table = TensorView::contiguous(fake, DType::kI32, {1, 2560});
  const TensorView lens = TensorView::contiguous(fake, DType::kI32, {1});
  const TensorView workspace = TensorView::contiguous(fake, DType::kU8, {0});
  bool refused = false;
  try {
    mla::prims_ts_batch_decode_with_kv_cache_mla(query, cache, workspace, 512, 64, table, lens, 163840, std::nullopt,
                                                 std::nullopt, std::nullopt, 1.0, 1.0, mla::MaskType::kCausal,
                                                 DType::kBf16, nullptr);
  } catch (const Error& e) {
    refused = e.code() == ErrorCode::kInvalidArgument && std::string(e.what()).find("query") != std::string::npos;
  }
  expect(refused, "a float32 query was not refused with invalid_argument naming 'query'");

  std::printf("consumer: %s\n", failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
