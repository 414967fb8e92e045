#include "nn/layer.h"

#include "core/error.h"

namespace sat {

void Layer::forward_cuda(LayerCtx&) { fail("layer kind ", kind(), " has no CUDA implementation"); }
void Layer::backward_cuda(LayerCtx&) { fail("layer kind ", kind(), " has no CUDA implementation"); }
void Layer::backward_input(LayerCtx&) { fail("internal error: layer kind ", kind(), " does not split its backward"); }

}  // namespace sat
