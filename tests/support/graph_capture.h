#pragma once
// Test-only RAII for streams and captured CUDA graphs through kiln's dlopen'ed driver.
#include "kiln/runtime/driver.h"

namespace kiln::testing {

// A non-blocking stream, destroyed with the object.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  CUstream get() const { return stream_; }

 private:
  CUstream stream_ = nullptr;
};

// What `enqueue` puts on a stream, captured in `mode` (global unless a test needs another); the
// graph and its instance (once instantiated) are destroyed with the object.
class CapturedGraph {
 public:
  // A launch that throws mid-capture would leave the stream capturing, failing every later call on
  // it: the capture is ended and its partial graph destroyed before the exception goes on.
  template <class Enqueue>
  CapturedGraph(CUstream stream, Enqueue&& enqueue, CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL) {
    begin(stream, mode);
    try {
      enqueue();
    } catch (...) {
      abandon(stream);
      throw;
    }
    end(stream);
  }
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  void instantiate();
  void launch(CUstream stream) const;  // after instantiate()

 private:
  static void begin(CUstream stream, CUstreamCaptureMode mode);
  static void abandon(CUstream stream);
  void end(CUstream stream);

  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
};

}  // namespace kiln::testing
