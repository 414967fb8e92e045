// The reference decoder (infer/decoder.h, --no-cache): the model's ordinary forward, on the
// engine, over the whole prefix at every call.
#include <algorithm>
#include <map>

#include "core/error.h"
#include "infer/decoder.h"
#include "nn/engine.h"
#include "nn/step_plan.h"

namespace sat {

namespace {

constexpr int64_t kShortestGraph = 16;  // tokens

// An inference graph of batch 1 and T tokens, its plan and engine over the shared store.
struct Window {
  BuiltModel model;
  StepPlan plan;
  std::unique_ptr<Engine> engine;
  std::vector<int32_t> x, y;  // the graph's inputs: the tokens, and labels (the loss is ignored)
};

class FullDecoder : public Decoder {
 public:
  FullDecoder(const ModelConfig& mc, ParamStore& ps) : Decoder(mc.context, mc.vocab), mc_(mc), ps_(ps) {
    SAT_CHECK(mc.tokens, "--model ", mc.name, ": generation needs a language model (gpt: or llama:)");
    SAT_CHECK(mc.tp == 1 && mc.device == Device::cpu, "internal error: the reference decoder runs one CPU process");
  }

 private:
  // The graph of the next power of two tokens >= n (at least kShortestGraph, at most the
  // context), built on first use. Its parameters must be the store's, in the store's order.
  Window& window(int64_t n) {
    int64_t T = kShortestGraph;
    while (T < n) T *= 2;
    T = std::min(T, context());
    auto it = windows_.find(T);
    if (it != windows_.end()) return it->second;
    Window& w = windows_[T];
    ModelConfig mc = mc_;
    mc.seq_len = T;
    w.model = build_model(mc, 1, false);
    const Graph& g = *w.model.graph;
    SAT_CHECK(g.params().size() == ps_.num_params(), "internal error: the store is not the model's");
    for (size_t i = 0; i < g.params().size(); ++i)
      SAT_CHECK(g.params()[i].name == ps_.decl(i).name, "internal error: the store is not the model's");
    Timeline t;
    t.uses.push_back(MicroUse{});  // one forward, no backward
    w.plan = plan_step(g, t);
    w.engine = std::make_unique<Engine>(*w.model.graph, ps_, w.plan);
    w.x.assign(size_t(T), 0);
    w.y.assign(size_t(T), 0);
    return w;
  }

  void run(const int32_t* tok, int64_t n, int64_t first) override {
    prefix_.resize(size_t(first));
    prefix_.insert(prefix_.end(), tok, tok + n);
    const int64_t len = int64_t(prefix_.size());
    Window& w = window(len);
    std::fill(w.x.begin(), w.x.end(), 0);  // positions past the prefix: any token, unread by it
    std::copy(prefix_.begin(), prefix_.end(), w.x.begin());
    const Shape shape{1, int64_t(w.x.size())};
    w.engine->forward(0, 0, false, 0, {Tensor(w.x.data(), shape, DType::i32), Tensor(w.y.data(), shape, DType::i32)});
    (void)w.engine->take_losses();
    const Tensor logits = w.engine->value(0, w.model.logits);  // [1, T, vocab]
    const float* row = logits.f32() + (len - 1) * vocab();
    logits_.assign(row, row + vocab());
  }

  ModelConfig mc_;
  ParamStore& ps_;
  std::map<int64_t, Window> windows_;
  std::vector<int32_t> prefix_;
};

}  // namespace

std::unique_ptr<Decoder> make_full_decoder(const ModelConfig& mc, ParamStore& ps) {
  return std::make_unique<FullDecoder>(mc, ps);
}

}  // namespace sat
