// The data loader alone: opens any --data SPEC as `saturate train` does (open_dataset, shaped
// for --model's input), runs sat::BatchLoader over --batches batches with each of --workers
// reading threads, and prints images (samples) per second, the best of --repeat rounds (the
// machine is shared and noisy). The consumer does nothing but take the batches, so this is
// the most the loader can hand out: a training step waits for data when its own rate is
// higher. The first --warmup batches of a round are not timed (the ring filling, the
// workers starting). --split train reads Dataset::get_train (training order and
// augmentation), test Dataset::get (evaluation's transform, file order). bench/data/compare
// runs it beside PyTorch's DataLoader (bench/data/README.md).
//
//   build/loader_bench --data fashion-mnist [--model convnet] [--batch 64] [--batches 200]
//                      [--workers 0,1,2] [--prefetch 2] [--split train|test] [--normalize M,S] [--augment A] [--size S]
//                      [--warmup 5] [--repeat 3] [--rows-per-claim N] [--json]
// --rows-per-claim: the rows a worker claims at once (0: the loader's choice, a batch split
// into about 2W pieces; the batch size: whole batches).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli/args.h"
#include "core/error.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "train/trainer.h"

namespace {

struct Options {
  std::string data = "synthetic", model = "convnet", split = "train", normalize, augment;
  int64_t size = 0;  // image folders: the side of the square the images become (0: the model's input)
  int64_t batch = 64, batches = 200, warmup = 5;
  std::vector<int> workers{0, 1, 2};
  int prefetch = 2, repeat = 3;
  int64_t rows_per_claim = 0;
  bool json = false;
};

std::vector<int> int_list(const std::string& s) {
  std::vector<int> v;
  for (size_t at = 0; at <= s.size();) {
    const size_t comma = std::min(s.find(',', at), s.size());
    v.push_back(std::atoi(s.substr(at, comma - at).c_str()));
    at = comma + 1;
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      SAT_CHECK(i + 1 < argc, a, ": expected a value");
      return argv[++i];
    };
    if (a == "--data") o.data = value();
    else if (a == "--model") o.model = value();
    else if (a == "--split") o.split = value();
    else if (a == "--normalize") o.normalize = value();
    else if (a == "--augment") o.augment = value();
    else if (a == "--size") o.size = std::atoll(value().c_str());
    else if (a == "--batch") o.batch = std::atoll(value().c_str());
    else if (a == "--batches") o.batches = std::atoll(value().c_str());
    else if (a == "--warmup") o.warmup = std::atoll(value().c_str());
    else if (a == "--workers") o.workers = int_list(value());
    else if (a == "--prefetch") o.prefetch = std::atoi(value().c_str());
    else if (a == "--rows-per-claim") o.rows_per_claim = std::atoll(value().c_str());
    else if (a == "--repeat") o.repeat = std::atoi(value().c_str());
    else if (a == "--json") o.json = true;
    else sat::fail("unknown option ", a, " (see the comment at the top of bench/data/loader_bench.cpp)");
  }
  SAT_CHECK(o.split == "train" || o.split == "test", "--split: expected train or test, got '", o.split, "'");
  SAT_CHECK(o.batch >= 1 && o.batches >= 1 && o.warmup >= 0 && o.repeat >= 1 && o.prefetch >= 0 &&
                o.rows_per_claim >= 0,
            "--batch, --batches, --repeat: expected positive numbers; --warmup, --prefetch, --rows-per-claim: >= 0");
  for (int w : o.workers) SAT_CHECK(w >= 0 && w <= sat::kMaxLoaderWorkers, "--workers: expected 0 to 256 each");
  return o;
}

// Samples per second over `o.batches` batches after `o.warmup` untimed ones (epochs roll
// over as training's do).
double round_rate(const sat::Dataset& ds, const Options& o, int workers, uint64_t seed) {
  const bool train = o.split == "train";
  const sat::LoaderOptions opt{o.prefetch, 1, workers, o.rows_per_claim};
  sat::BatchLoader L(ds, o.batch, train, seed, train, sat::Sharding{}, opt);
  int64_t epoch = 0;
  sat::Batch b;
  auto take = [&] {
    while (!L.next(b)) L.start_epoch(++epoch);
  };
  L.start_epoch(0);
  for (int64_t k = 0; k < o.warmup; ++k) take();
  const double t0 = sat::now_seconds();
  for (int64_t k = 0; k < o.batches; ++k) take();
  return double(o.batches * o.batch) / (sat::now_seconds() - t0);
}

int run(const Options& o) {
  sat::ModelConfig mc = sat::cli::model_for(o.model, 0, 0);
  sat::DataOptions dopt = sat::data_options_for(mc, 0);
  if (!o.normalize.empty()) sat::parse_normalize(o.normalize, dopt);
  dopt.augment = o.augment;  // image folders: off | standard | crop,flip (training's get_train)
  if (o.size > 0) dopt.image_shape = sat::Shape{dopt.image_shape[0], o.size, o.size};
  const sat::DataSplit data = sat::open_dataset(o.data, dopt);
  const sat::Dataset* ds = o.split == "train" ? data.train.get() : data.test.get();
  SAT_CHECK(ds, "--split test: ", o.data, " has no test split");
  std::fprintf(stderr, "loader_bench: %s, %s split (%s), batch %lld, %lld batches after %lld warm-up, best of %d\n",
               data.description.c_str(), o.split.c_str(), o.split == "train" ? "get_train" : "get",
               (long long)o.batch, (long long)o.batches, (long long)o.warmup, o.repeat);
  std::vector<double> best(o.workers.size(), 0);
  for (int r = 0; r < o.repeat; ++r)  // workers alternate within a round (the machine's load drifts)
    for (size_t i = 0; i < o.workers.size(); ++i)
      best[i] = std::max(best[i], round_rate(*ds, o, o.workers[i], uint64_t(r)));
  if (o.json) {
    std::printf("{\"data\": \"%s\", \"split\": \"%s\", \"batch\": %lld, \"images_per_second\": {", o.data.c_str(),
                o.split.c_str(), (long long)o.batch);
    for (size_t i = 0; i < o.workers.size(); ++i) std::printf("%s\"%d\": %.1f", i ? ", " : "", o.workers[i], best[i]);
    std::printf("}}\n");
    return 0;
  }
  std::printf("%8s %14s %8s\n", "workers", "images/s", "vs W=1");
  const auto one = std::find(o.workers.begin(), o.workers.end(), 1);
  for (size_t i = 0; i < o.workers.size(); ++i) {
    const double base = one == o.workers.end() ? 0 : best[size_t(one - o.workers.begin())];
    const std::string ratio = base > 0 ? sat::str_cat(std::round(100 * best[i] / base) / 100) : "-";
    std::printf("%8d %14.1f %8s\n", o.workers[i], best[i], ratio.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const sat::Error& e) {
    std::fprintf(stderr, "loader_bench: %s\n", e.what());
    return 2;
  }
}
