#include "train/agree.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/text.h"

namespace sat {
namespace {

// FNV-1a over 8-byte words, in parallel chunks combined in order.
uint64_t hash_bytes(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull) {
  constexpr uint64_t kPrime = 1099511628211ull;
  const auto* p = static_cast<const unsigned char*>(data);
  constexpr size_t kChunk = size_t(1) << 22;
  const int64_t chunks = int64_t((bytes + kChunk - 1) / kChunk);
  std::vector<uint64_t> part(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t lo = size_t(c) * kChunk, hi = std::min(bytes, lo + kChunk);
    uint64_t x = 1469598103934665603ull;
    size_t i = lo;
    for (; i + 8 <= hi; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      x = (x ^ w) * kPrime;
    }
    for (; i < hi; ++i) x = (x ^ p[i]) * kPrime;
    part[size_t(c)] = x;
  }
  for (uint64_t x : part) h = (h ^ x) * kPrime;
  return (h ^ bytes) * kPrime;
}

// Prints this rank's line, waits until every rank has printed its own, and ends the run.
[[noreturn]] void fail_together(dist::Comm& world, const std::string& line) {
  std::fprintf(stderr, "saturate: error on rank %d: %s\n", world.rank(), printable(line).c_str());
  std::fflush(stderr);
  world.barrier();
  throw ReportedError(line);
}

// The value of field `key` in a fingerprint ("" when absent).
std::string field(const std::string& fp, const std::string& key) {
  size_t pos = 0;
  while (pos < fp.size()) {
    const size_t end = fp.find(';', pos), eq = fp.find('=', pos);
    const size_t stop = end == std::string::npos ? fp.size() : end;
    if (eq < stop && fp.compare(pos, eq - pos, key) == 0) return fp.substr(eq + 1, stop - eq - 1);
    pos = stop + 1;
  }
  return "";
}

// The first field of `mine` whose value differs from `theirs`.
std::string first_difference(const std::string& mine, const std::string& theirs) {
  size_t pos = 0;
  while (pos < mine.size()) {
    const size_t end = mine.find(';', pos), eq = mine.find('=', pos);
    const size_t stop = end == std::string::npos ? mine.size() : end;
    if (eq < stop) {
      const std::string key = mine.substr(pos, eq - pos), v = mine.substr(eq + 1, stop - eq - 1);
      if (field(theirs, key) != v) return str_cat(key, " ", v, " where rank 0 has ", field(theirs, key));
    }
    pos = stop + 1;
  }
  return "a field rank 0 has and this rank does not";
}

}  // namespace

std::string config_fingerprint(const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test) {
  const OptimConfig& o = cfg.optim;
  const ScheduleConfig& s = cfg.schedule;
  std::string split;
  for (int c : cfg.pp_split) split += str_cat(split.empty() ? "" : ",", c);
  return str_cat("model=", model_spec(mc), ";model_config=", describe_model(mc), ";vocab=", mc.vocab, ";seq_len=", mc.seq_len,
                 ";classes=", mc.classes, ";data=", train.name(), ";normalize=", train.scaling(), ";train_samples=", train.size(),
                 ";test_samples=", test ? test->size() : -1, ";batch=", cfg.batch, ";accum=", cfg.accum,
                 ";epochs=", cfg.epochs, ";steps=", cfg.steps, ";optimizer=", o.name, ";lr=", o.lr,
                 ";momentum=", o.momentum, ";nesterov=", o.nesterov, ";weight_decay=", o.weight_decay,
                 ";betas=", o.beta1, ",", o.beta2, ",", o.eps, ";clip_grad_norm=", o.clip_grad_norm > 0 ? str_cat(o.clip_grad_norm) : "off",
                 ";schedule=", s.name, ";warmup=", s.warmup, ",", s.warmup_fraction, ";step_size=", s.step_size,
                 ";gamma=", s.gamma, ";min_lr=", s.min_lr, ";seed=", cfg.seed, ";shuffle=", cfg.shuffle,
                 ";eval=", cfg.evaluate, ";tp=", cfg.tp, ";sequence_parallel=", cfg.sequence_parallel,
                 ";recompute=", int(cfg.recompute), ";pp=", cfg.pp, ";pp_schedule=", int(cfg.pp_schedule),
                 ";virtual_stages=", cfg.virtual_stages, ";pp_split=", split, ";last_batch=", int(cfg.last_batch),
                 ";bucket_mb=", cfg.bucket_mb, ";sync_bn=", cfg.sync_bn, ";zero=", cfg.zero,
                 ";noise_scale=", cfg.measure_noise, ";dist_backend=", int(cfg.dist_backend), ";device=", cfg.device,
                 ";precision=", precision_name(cfg.precision), ";cuda_graph=", cfg.cuda_graph,
                 ";checkpoints=", !cfg.checkpoint_dir.empty(),
                 // (only when on: the checkpoints of runs without them record the same settings as before)
                 cfg.cp > 1 ? str_cat(";cp=", cfg.cp) : "", cfg.ep > 1 ? str_cat(";ep=", cfg.ep) : "",
                 cfg.eval_every > 0 ? str_cat(";eval_every=", cfg.eval_every, ";eval_batches=", cfg.eval_batches,
                                              ";keep_best=", cfg.keep_best) : "");
}

void agree_on_config(dist::Comm& world, const std::string& fingerprint) {
  if (world.size() <= 1) return;
  int64_t n = int64_t(fingerprint.size());
  world.broadcast_sync(&n, 1, DType::i64, 0);
  std::string first(size_t(std::max<int64_t>(n, 0)), '\0');
  if (world.rank() == 0) first = fingerprint;
  if (n > 0) world.broadcast_sync(first.data(), size_t(n), DType::u8, 0);
  const bool differs = first != fingerprint;
  double v[2] = {differs ? 1.0 : 0.0, differs ? double(world.rank()) : 1e9};
  world.all_reduce_sync(&v[0], 1, DType::f64, dist::ReduceOp::sum);
  world.all_reduce_sync(&v[1], 1, DType::f64, dist::ReduceOp::min);
  if (v[0] == 0) return;
  const std::string fix = "launch every rank with the same flags, data and saturate";
  if (differs)
    fail_together(world, str_cat("the ranks disagree on the configuration: this rank has ",
                                 first_difference(fingerprint, first), " (", fix, ")"));
  fail_together(world, str_cat("the ranks disagree on the configuration: ", int64_t(v[0]),
                               " rank(s) differ from rank 0, the first rank ", int64_t(v[1]), " (see its line; ", fix,
                               ")"));
}

uint64_t store_checksum(const ParamStore& ps) {
  const float* p = ps.host_flat_params();  // the parameters on the host; their copy after sync_to_host on a GPU
  const int64_t n = ps.sharding().stage >= 3 ? ps.shard_len() : ps.flat_size();
  uint64_t h = hash_bytes(p, size_t(n) * sizeof(float));
  for (size_t i = 0; i < ps.num_states(); ++i) {
    const Tensor t = ps.host_state(i);
    h = hash_bytes(t.ptr, t.bytes(), h);
  }
  return h;
}

void agree_on_replicas(dist::Comm& world, dist::Comm& dp, uint64_t checksum, const std::string& what) {
  if (world.size() <= 1) return;
  uint64_t first = checksum;
  if (dp.size() > 1) dp.broadcast_sync(&first, 1, DType::i64, 0);
  const bool differs = first != checksum;
  double v[2] = {differs ? 1.0 : 0.0, differs ? double(world.rank()) : 1e9};
  world.all_reduce_sync(&v[0], 1, DType::f64, dist::ReduceOp::sum);
  world.all_reduce_sync(&v[1], 1, DType::f64, dist::ReduceOp::min);
  if (v[0] == 0) return;
  const std::string fix = "every rank must read the same file; copy it to each node";
  if (differs)
    fail_together(world, str_cat("the data-parallel replicas disagree on the weights from ", what,
                                 ": this rank's differ from its group's first rank (", fix, ")"));
  fail_together(world, str_cat("the data-parallel replicas disagree on the weights from ", what, ": ", int64_t(v[0]),
                               " rank(s) differ, the first rank ", int64_t(v[1]), " (see its line; ", fix, ")"));
}

}  // namespace sat
