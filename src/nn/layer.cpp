#include "nn/layer.h"

#include "core/error.h"

namespace sat {

void Layer::forward_cuda(LayerCtx&) { fail("layer kind ", kind(), " has no CUDA implementation"); }
void Layer::backward_cuda(LayerCtx&) { fail("layer kind ", kind(), " has no CUDA implementation"); }

}  // namespace sat
