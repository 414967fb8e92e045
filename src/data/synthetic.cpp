// Synthetic data: learnable, generated on the fly from (seed, index), nothing per-sample
// stored. Depends on DataOptions::seed (and the shapes) only.
//
// Images (train 10000, test 2000): each class has a fixed random prototype, piecewise
// constant on 4x4-pixel cells (so convolutions see spatial structure); a sample is
//   v = 0.15 + 0.7 * prototype[label] + brightness + noise,  brightness ~ U(-0.1, 0.1)
//   per sample, noise ~ U(-0.35, 0.35) per pixel, clamped to [0,1] and quantized to a
// uint8 pixel, which then goes through the same pixel/255 (or --normalize) conversion
// as real images. Labels are uniform over the classes. A linear model can separate the
// classes; a training run shows its loss falling within the first epoch.
//
// Tokens (train 2000, test 200 sequences of T): a sparse Markov chain over A = min(V,
// 512) token ids picked at random from the vocabulary; each state has 4 successors
// with probabilities 0.55, 0.25, 0.15, 0.05 (entropy at most 1.11 nats, less where
// successors coincide: the best achievable loss; a model that learns nothing has ln V). x = s[0..T), y = s[1..T].
#include <algorithm>
#include <cmath>

#include "backend/device.h"
#include "core/alloc.h"
#include "core/rng.h"
#include "data/sources.h"

namespace sat::data_detail {
namespace {

constexpr int64_t kImageTrain = 10000, kImageTest = 2000;
constexpr int64_t kTokenTrain = 2000, kTokenTest = 200;
constexpr int64_t kCell = 4;       // prototype cell size in pixels
constexpr int64_t kActive = 512;   // tokens used by the Markov chain (at most)
constexpr int kSucc = 4;           // successors per state

// Shared, immutable description of the generator (prototypes / chain).
struct ImageGen {
  Shape chw;
  int64_t classes, gh, gw;
  std::vector<float> proto;  // classes x C x gh x gw, in [0,1)
  std::vector<float> lut;    // C*256
  std::string scaling;       // scaling_text of the options that made lut
};

class SyntheticImages : public Dataset {
 public:
  SyntheticImages(std::shared_ptr<const ImageGen> g, uint64_t stream, int64_t n, std::string name)
      : g_(std::move(g)), stream_(stream), n_(n), name_(std::move(name)) {}
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return g_->chw; }
  DType sample_dtype() const override { return DType::f32; }
  Shape label_shape() const override { return Shape{}; }
  int64_t num_classes() const override { return g_->classes; }
  std::string name() const override { return name_; }
  std::string scaling() const override { return g_->scaling; }
  void get(int64_t i, void* x, int32_t* y) const override {
    const ImageGen& g = *g_;
    const int64_t C = g.chw[0], H = g.chw[1], W = g.chw[2];
    Rng rng(mix_seed(stream_, uint64_t(i)));
    const int64_t label = int64_t(rng.below(uint64_t(g.classes)));
    const float bright = rng.uniform(-0.1f, 0.1f);
    float* out = static_cast<float*>(x);
    for (int64_t c = 0; c < C; ++c) {
      const float* p = g.proto.data() + (label * C + c) * g.gh * g.gw;
      const float* lut = g.lut.data() + c * 256;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w) {
          float v = 0.15f + 0.7f * p[(h / kCell) * g.gw + w / kCell] + bright + rng.uniform(-0.35f, 0.35f);
          v = std::clamp(v, 0.0f, 1.0f);
          *out++ = lut[int(std::lround(v * 255.0f))];
        }
    }
    *y = int32_t(label);
  }

 private:
  std::shared_ptr<const ImageGen> g_;
  uint64_t stream_;
  int64_t n_;
  std::string name_;
};

struct TokenGen {
  int64_t T, vocab, A;
  std::vector<int32_t> active;  // A token ids
  std::vector<int32_t> succ;    // A x kSucc state indices
};

class SyntheticTokens : public Dataset {
 public:
  SyntheticTokens(std::shared_ptr<const TokenGen> g, uint64_t stream, int64_t n, std::string name)
      : g_(std::move(g)), stream_(stream), n_(n), name_(std::move(name)) {}
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return Shape{g_->T}; }
  DType sample_dtype() const override { return DType::i32; }
  Shape label_shape() const override { return Shape{g_->T}; }
  int64_t num_classes() const override { return g_->vocab; }
  std::string name() const override { return name_; }
  void get(int64_t i, void* x, int32_t* y) const override {
    const TokenGen& g = *g_;
    Rng rng(mix_seed(stream_, uint64_t(i)));
    int32_t* xi = static_cast<int32_t*>(x);
    int64_t s = int64_t(rng.below(uint64_t(g.A)));
    for (int64_t t = 0; t < g.T; ++t) {
      xi[t] = g.active[size_t(s)];
      float u = rng.uniform();
      int k = u < 0.55f ? 0 : u < 0.80f ? 1 : u < 0.95f ? 2 : 3;
      s = g.succ[size_t(s * kSucc + k)];
      y[t] = g.active[size_t(s)];
    }
  }

 private:
  std::shared_ptr<const TokenGen> g_;
  uint64_t stream_;
  int64_t n_;
  std::string name_;
};

// Independent streams derived from the seed.
enum : uint64_t { kProtoStream = 0x5107, kTrainStream = 0x7a1, kTestStream = 0x7e57, kChainStream = 0xc4a1 };

// Synthetic data's sizes and shapes, for planning: nothing generated (get() is never called).
class SyntheticShapes : public Dataset {
 public:
  SyntheticShapes(const DataOptions& opt, Shape chw, int64_t n, std::string name)
      : opt_(opt), chw_(chw), n_(n), name_(std::move(name)) {}
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return opt_.model_takes_tokens ? Shape{opt_.seq_len} : chw_; }
  DType sample_dtype() const override { return opt_.model_takes_tokens ? DType::i32 : DType::f32; }
  Shape label_shape() const override { return opt_.model_takes_tokens ? Shape{opt_.seq_len} : Shape{}; }
  int64_t num_classes() const override { return opt_.model_takes_tokens ? opt_.vocab : opt_.num_classes; }
  std::string name() const override { return name_; }
  void get(int64_t, void*, int32_t*) const override {
    fail("internal error: ", name_, " has shapes only; its samples are never generated");
  }

 private:
  DataOptions opt_;
  Shape chw_;
  int64_t n_;
  std::string name_;
};

// What generating synthetic data holds in host memory (its generator, and a sample as the
// loader copies it) against what this machine has: refused naming --data before anything
// is allocated.
void check_synthetic_fits(const std::string& what, double bytes) {
  const double avail = double(host_available_memory());
  SAT_CHECK(avail == 0 || bytes <= avail / 2, "--data synthetic: ", what, " needs ", format_bytes(bytes),
            " of host memory, more than half of the ", format_bytes(avail),
            " this machine has available; expected smaller samples");
}

}  // namespace

DataSplit open_synthetic_images(Shape chw, int64_t classes, const DataOptions& opt) {
  SAT_CHECK(classes >= 2, "--data synthetic: the model has ", classes, " classes; expected at least 2");
  const double C = double(chw[0]), H = double(chw[1]), W = double(chw[2]);
  check_synthetic_fits(str_cat("a sample of ", chw.str(), " float32 and ", classes, " class prototypes"),
                       4 * C * H * W + 4 * double(classes) * C * std::ceil(H / kCell) * std::ceil(W / kCell));
  auto g = std::make_shared<ImageGen>();
  g->chw = chw;
  g->classes = classes;
  g->gh = (chw[1] + kCell - 1) / kCell;
  g->gw = (chw[2] + kCell - 1) / kCell;
  g->lut = pixel_lut(chw[0], opt);
  g->scaling = scaling_text(opt);
  Rng rng(mix_seed(opt.seed, kProtoStream));
  g->proto.resize(size_t(classes * chw[0] * g->gh * g->gw));
  for (float& v : g->proto) v = rng.uniform();
  DataSplit s;
  s.train = std::make_unique<SyntheticImages>(g, mix_seed(opt.seed, kTrainStream), kImageTrain, "synthetic train");
  s.test = std::make_unique<SyntheticImages>(g, mix_seed(opt.seed, kTestStream), kImageTest, "synthetic test");
  s.description = str_cat("synthetic images ", chw.str(), ", ", classes, " classes (seed ", opt.seed, "): ",
                          kImageTrain, " train / ", kImageTest, " test, class prototypes + noise, ",
                          scaling_text(opt));
  return s;
}

DataSplit open_synthetic_tokens(const DataOptions& opt) {
  check_synthetic_fits(str_cat("a vocabulary of ", opt.vocab, " token ids"), 4 * double(opt.vocab));
  auto g = std::make_shared<TokenGen>();
  g->T = opt.seq_len;
  g->vocab = opt.vocab;
  g->A = std::min(opt.vocab, kActive);
  Rng rng(mix_seed(opt.seed, kChainStream));
  // A distinct ids: partial Fisher-Yates over 0..V-1.
  std::vector<int32_t> ids(size_t(opt.vocab));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  for (int64_t i = 0; i < g->A; ++i) {
    int64_t j = i + int64_t(rng.below(uint64_t(opt.vocab - i)));
    std::swap(ids[size_t(i)], ids[size_t(j)]);
  }
  g->active.assign(ids.begin(), ids.begin() + g->A);
  g->succ.resize(size_t(g->A * kSucc));
  for (auto& s : g->succ) s = int32_t(rng.below(uint64_t(g->A)));
  DataSplit s;
  s.train = std::make_unique<SyntheticTokens>(g, mix_seed(opt.seed, kTrainStream), kTokenTrain, "synthetic train");
  s.test = std::make_unique<SyntheticTokens>(g, mix_seed(opt.seed, kTestStream), kTokenTest, "synthetic test");
  s.description = str_cat("synthetic tokens (seed ", opt.seed, "): ", kTokenTrain, " train / ", kTokenTest,
                          " test sequences of ", opt.seq_len, ", vocabulary ", opt.vocab, ", Markov chain over ",
                          g->A, " tokens (best loss <= 1.11 nats)");
  return s;
}

}  // namespace sat::data_detail

namespace sat {

DataSplit synthetic_shapes(const DataOptions& opt, Shape chw) {
  DataSplit s;
  using namespace data_detail;
  const bool tok = opt.model_takes_tokens;
  s.train = std::make_unique<SyntheticShapes>(opt, chw, tok ? kTokenTrain : kImageTrain, "synthetic train (shapes)");
  s.test = std::make_unique<SyntheticShapes>(opt, chw, tok ? kTokenTest : kImageTest, "synthetic test (shapes)");
  s.description = "synthetic data's shapes (nothing generated)";
  return s;
}

}  // namespace sat
