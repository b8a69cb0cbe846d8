#include "tests/support/graph_capture.h"

namespace kiln::testing {

Stream::Stream() {
  const Driver& d = Driver::get();
  d.check(d.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
}

Stream::~Stream() { Driver::get().cuStreamDestroy(stream_); }

CapturedGraph::~CapturedGraph() {
  const Driver& d = Driver::get();
  if (exec_) d.cuGraphExecDestroy(exec_);
  if (graph_) d.cuGraphDestroy(graph_);
}

void CapturedGraph::begin(CUstream stream, CUstreamCaptureMode mode) {
  const Driver& d = Driver::get();
  d.check(d.cuStreamBeginCapture(stream, mode), "cuStreamBeginCapture");
}

void CapturedGraph::abandon(CUstream stream) {
  const Driver& d = Driver::get();
  CUgraph partial = nullptr;
  d.cuStreamEndCapture(stream, &partial);
  if (partial) d.cuGraphDestroy(partial);
}

void CapturedGraph::end(CUstream stream) {
  const Driver& d = Driver::get();
  d.check(d.cuStreamEndCapture(stream, &graph_), "cuStreamEndCapture");
}

void CapturedGraph::instantiate() {
  const Driver& d = Driver::get();
  d.check(d.cuGraphInstantiateWithFlags(&exec_, graph_, 0), "cuGraphInstantiateWithFlags");
}

void CapturedGraph::launch(CUstream stream) const {
  const Driver& d = Driver::get();
  d.check(d.cuGraphLaunch(exec_, stream), "cuGraphLaunch");
}

}  // namespace kiln::testing
