#include "nn/layers/tensor_parallel.h"

#include <cstring>

#include "dist/comm.h"

namespace sat {
namespace {

void one_float_input(const LayerSetup& s, const char* kind) {
  SAT_CHECK(s.inputs.size() == 1 && s.inputs[0].dtype == s.act, kind, " ", s.name, ": expected one ",
            dtype_name(s.act), " input");
}

dist::Comm& group_of(const LayerCtx& c, const TPRank& tp, const char* kind) {
  SAT_CHECK(c.group && c.group->size() == tp.parts && c.group->rank() == tp.index, "internal error: ", kind,
            " runs without its tensor-parallel group of ", tp.parts, " ranks");
  return *c.group;
}

void copy(const Tensor& from, const Tensor& to) { std::memcpy(to.ptr, from.ptr, to.bytes()); }

}  // namespace

void TPCopy::setup(LayerSetup& s) {
  one_float_input(s, kind());
  s.set_output(s.inputs[0].shape, s.act);
  s.comm_bwd = double(s.inputs[0].bytes());
}

void TPCopy::forward(LayerCtx& c) { copy(c.in[0], c.out); }

void TPCopy::backward(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  copy(c.dout, c.din[0]);
  group_of(c, tp_, kind()).all_reduce_sync(c.din[0].ptr, size_t(c.din[0].numel()), c.din[0].dtype, dist::ReduceOp::sum);
}

void TPAllReduce::setup(LayerSetup& s) {
  one_float_input(s, kind());
  s.set_output(s.inputs[0].shape, s.act);
  s.comm_fwd = double(s.inputs[0].bytes());
}

void TPAllReduce::forward(LayerCtx& c) {
  copy(c.in[0], c.out);
  group_of(c, tp_, kind()).all_reduce_sync(c.out.ptr, size_t(c.out.numel()), c.out.dtype, dist::ReduceOp::sum);
}

void TPAllReduce::backward(LayerCtx& c) {
  if (c.din[0].defined()) copy(c.dout, c.din[0]);
}

void TPAllGather::setup(LayerSetup& s) {
  one_float_input(s, kind());
  SAT_CHECK(full_.numel() == s.inputs[0].shape.numel() * tp_.parts, "TPAllGather ", s.name, ": ", tp_.parts,
            " parts of ", s.inputs[0].shape.str(), " do not make ", full_.str());
  s.set_output(full_, s.act);
  s.comm_fwd = double(s.output.bytes());
  s.comm_bwd = double(s.output.bytes());
}

void TPAllGather::forward(LayerCtx& c) {
  group_of(c, tp_, kind()).all_gather(c.in[0].ptr, c.out.ptr, size_t(c.in[0].numel()), c.out.dtype)->wait();
}

void TPAllGather::backward(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  group_of(c, tp_, kind())
      .reduce_scatter(c.dout.ptr, c.din[0].ptr, size_t(c.din[0].numel()), c.dout.dtype, dist::ReduceOp::sum)
      ->wait();
}

void TPReduceScatter::setup(LayerSetup& s) {
  one_float_input(s, kind());
  const Shape& in = s.inputs[0].shape;
  const int64_t C = in[-1], rows = in.numel() / C;
  SAT_CHECK(rows % tp_.parts == 0, "TPReduceScatter ", s.name, ": ", rows, " rows do not divide into ", tp_.parts,
            " parts");
  s.set_output(Shape{rows / tp_.parts, C}, s.act);
  s.comm_fwd = double(s.inputs[0].bytes());
  s.comm_bwd = double(s.inputs[0].bytes());
}

void TPReduceScatter::forward(LayerCtx& c) {
  group_of(c, tp_, kind())
      .reduce_scatter(c.in[0].ptr, c.out.ptr, size_t(c.out.numel()), c.out.dtype, dist::ReduceOp::sum)
      ->wait();
}

void TPReduceScatter::backward(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  group_of(c, tp_, kind()).all_gather(c.dout.ptr, c.din[0].ptr, size_t(c.dout.numel()), c.dout.dtype)->wait();
}

}  // namespace sat
