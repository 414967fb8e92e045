// The time of one new token at several prefix lengths, with the KV cache (infer/decoder.h's
// cached decoder: one position's work) and without it (the reference: the model's forward
// over the whole prefix), on a model of random weights. With the cache the time should stay
// nearly flat (only attention grows, by one dot product per cached position and head); without
// it, grow with the prefix.
//
// At each length L the first L - 1 tokens are appended once, then the L-th is appended
// --repeat times (truncating back to L - 1 between them); the fastest and the median are
// reported (on a shared machine the fastest is the one least disturbed). The
// reference runs graphs of power-of-two lengths, so lengths that are powers of two time the
// forward over exactly L tokens.
//
//   build/generate_speed [--model gpt:layers=4,heads=4,width=256,context=1024,vocab=4096]
//                        [--lengths 16,64,256,512] [--repeat 9] [--threads 2]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/blas.h"
#include "core/rng.h"
#include "infer/decoder.h"
#include "infer/generate.h"

using namespace sat;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Options {
  std::string model = "gpt:layers=4,heads=4,width=256,context=1024,vocab=4096";
  std::vector<int64_t> lengths = {16, 64, 256, 512};
  int repeat = 9, threads = 2;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") {
      o.model = v;
    } else if (k == "--lengths") {
      o.lengths.clear();
      std::stringstream s(v);
      for (std::string x; std::getline(s, x, ',');) o.lengths.push_back(std::atoll(x.c_str()));
    } else if (k == "--repeat") {
      o.repeat = std::max(1, std::atoi(v.c_str()));
    } else if (k == "--threads") {
      o.threads = std::atoi(v.c_str());
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      std::exit(2);
    }
  }
  return o;
}

struct Times {
  double best, median;  // seconds
};

// The time of appending token L (after L - 1), and the logits it gave.
Times time_token(Decoder& d, const std::vector<int32_t>& tokens, int64_t L, int repeat, std::vector<float>& logits) {
  d.reset();
  if (L > 1) d.append(std::span<const int32_t>(tokens.data(), size_t(L - 1)));
  std::vector<double> t;
  for (int r = 0; r < repeat; ++r) {
    d.truncate(L - 1);
    const double t0 = now();
    logits = d.append(std::span<const int32_t>(tokens.data() + L - 1, 1));
    t.push_back(now() - t0);
  }
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  cpu::set_num_threads(o.threads);
  ModelConfig mc = model_config(o.model);
  const BuiltModel b = build_model(mc, 1, false);
  ParamStore ps(b.graph->params(), b.graph->states(), 0);
  ps.init(1);
  auto cached = make_cached_decoder(mc, ps);
  auto full = make_full_decoder(mc, ps);
  Rng rng(7);
  std::vector<int32_t> tokens(size_t(mc.context));
  for (auto& t : tokens) t = int32_t(rng.below(uint64_t(mc.vocab)));
  std::printf("%s, %lld parameters, %d threads; ms per token, fastest (median) of %d\n", o.model.c_str(),
              static_cast<long long>(ps.param_count()), o.threads, o.repeat);
  std::printf("%8s  %18s  %20s  %8s  %s\n", "prefix", "KV cache", "no cache", "speed-up", "max |logit difference|");
  for (int64_t L : o.lengths) {
    if (L < 1 || L > mc.context) continue;
    std::vector<float> lc, lf;
    const Times tc = time_token(*cached, tokens, L, o.repeat, lc);
    const Times tf = time_token(*full, tokens, L, o.repeat, lf);
    float diff = 0;
    for (size_t i = 0; i < lc.size(); ++i) diff = std::max(diff, std::fabs(lc[i] - lf[i]));
    std::printf("%8lld  %8.3f (%7.3f)  %9.3f (%8.3f)  %7.1fx  %.2g\n", static_cast<long long>(L), 1e3 * tc.best,
                1e3 * tc.median, 1e3 * tf.best, 1e3 * tf.median, tf.best / tc.best, double(diff));
    std::fflush(stdout);
  }
  return 0;
}
