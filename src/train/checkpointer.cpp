#include "train/checkpointer.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/timer.h"
#include "dist/verdict.h"
#include "nn/shard.h"
#include "train/checkpoint.h"
#include "train/dir_lock.h"
#include "train/resume_policy.h"
#include "train/signals.h"
#include "train/runtime.h"
#include "train/weights.h"

namespace sat {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> slot_names(const std::string& optimizer, int slots) {
  if (optimizer == "adamw") return {"exp_avg", "exp_avg_sq"};
  if (slots == 1) return {"momentum_buffer"};
  return {};
}

// Optimizer slot s of this tensor-parallel rank's whole store (flat_size() floats, the
// parameters' layout) on data-parallel rank 0, the one that writes it (and on the other
// writers of an unsharded store: under --ep the first ep dp ranks, `writer`); the other ranks
// send their ZeRO shard there and get nothing back, so none of them holds more than its shard.
// Collective over dp when the store is sharded.
std::vector<float> full_slot(const ParamStore& ps, int s, dist::Comm& dp, bool writer) {
  constexpr int kTag = 0x5a7c;  // nothing else is in flight between steps
  const StoreSharding& sh = ps.sharding();
  const int64_t len = ps.shard_len();
  if (dp.rank() != 0) {
    if (sh.stage != 0 && sh.parts > 1) dp.send(ps.flat_slot(s), size_t(len), DType::f32, 0, kTag)->wait();
    if (writer && (sh.stage == 0 || sh.parts == 1)) return {ps.flat_slot(s), ps.flat_slot(s) + ps.flat_size()};
    return {};
  }
  if (sh.stage == 0 || sh.parts == 1) return {ps.flat_slot(s), ps.flat_slot(s) + ps.flat_size()};
  std::vector<float> all(size_t(len) * size_t(sh.parts));
  std::copy_n(ps.flat_slot(s), len, all.data());
  for (int r = 1; r < sh.parts; ++r) dp.recv(all.data() + size_t(r) * size_t(len), size_t(len), DType::f32, r, kTag)->wait();
  if (sh.stage == 1) {
    all.resize(size_t(std::max<int64_t>(ps.flat_size(), int64_t(all.size()))));
    return all;
  }
  std::vector<float> full(size_t(ps.flat_size()), 0.0f);
  for (size_t u = 0; u < ps.num_units(); ++u) {
    const int64_t lo = ps.unit_begin(u), n = ps.unit_piece(u);
    for (int r = 0; r < sh.parts; ++r) std::copy_n(all.data() + r * len + lo / sh.parts, n, full.data() + lo + r * n);
  }
  return full;
}

// The reverse: this rank's shard of slot s from the whole store's array.
void set_slot(ParamStore& ps, int s, const std::vector<float>& full) {
  const StoreSharding& sh = ps.sharding();
  float* dst = ps.flat_slot(s);
  if (sh.stage == 0 || sh.parts == 1) {
    std::copy_n(full.data(), ps.flat_size(), dst);
  } else if (sh.stage == 1) {
    const int64_t b = ps.shard_begin(), n = ps.shard_len();
    for (int64_t k = 0; k < n; ++k) dst[k] = b + k < int64_t(full.size()) ? full[size_t(b + k)] : 0.0f;
  } else {
    for (size_t u = 0; u < ps.num_units(); ++u) {
      const int64_t lo = ps.unit_begin(u), n = ps.unit_piece(u);
      std::copy_n(full.data() + lo + sh.index * n, n, dst + lo / sh.parts);
    }
  }
}

CkptEntry entry_of(const std::string& name, const ParamDecl& d, const void* data, DType dtype) {
  CkptEntry e;
  e.name = name;
  e.full_shape = d.full_shape().vec();
  e.shape = d.spec.shape.vec();
  e.dtype = dtype;
  e.data = data;
  if (d.shard.split()) e.dim = d.shard.dim, e.parts = d.shard.parts, e.index = d.shard.index, e.stride = d.shard.stride;
  return e;
}

// Puts the directory `tmp` in place of `dest` at once: renameat2's RENAME_EXCHANGE swaps the
// two (the old one, now at tmp, is then removed), so that a reader finds the old checkpoint or
// the new one, never neither. A file system that cannot swap (EINVAL: NFS, ...) has the old
// one moved aside first.
void replace_dir(const fs::path& tmp, const fs::path& dest, const std::string& flag) {
  std::error_code ec;
  const fs::path old = dest.parent_path() / ("." + dest.filename().string() + ".old");
  if (fs::exists(dest, ec)) {
    if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dest.c_str(), RENAME_EXCHANGE) == 0) {
      fs::remove_all(tmp, ec);
      return;
    }
    const int e = errno;
    SAT_CHECK(e == EINVAL || e == ENOSYS || e == ENOTSUP, flag, ": cannot replace ", dest.string(), ": ",
              std::strerror(e));
    fs::remove_all(old, ec);
    fs::rename(dest, old, ec);
    SAT_CHECK(!ec, flag, ": cannot move ", dest.string(), " aside: ", ec.message());
  }
  fs::rename(tmp, dest, ec);
  SAT_CHECK(!ec, flag, ": cannot rename ", tmp.string(), " to ", dest.string(), ": ", ec.message());
  fs::remove_all(old, ec);
}

// Every rank's agreement on `ok` (all must be true), with the first failing rank's message.
void agree(dist::Comm& w, bool ok, const std::string& message) {
  if (w.size() <= 1) {
    if (!ok) fail(message);
    return;
  }
  // The job's verdict (dist/verdict.h): every rank stops with the first failing rank's line.
  if (!ok) dist::print_rank_error(w.rank(), message);
  dist::Verdict v;
  dist::agree_on_outcome(w, ok ? nullptr : &message, v);
  if (!v.ok()) dist::stop_with(w, v, !ok);
}

}  // namespace

Checkpointer::Checkpointer(RankRuntime& rt) : rt_(rt) {
  if (rt.cfg.checkpoint_dir.empty()) return;
  std::string error;
  try {
    if (rt.world->rank() == 0) lock_ = std::make_unique<DirLock>(rt.cfg.checkpoint_dir, "--checkpoint-dir");
  } catch (const Error& e) {
    error = e.what();
  }
  agree(*rt.world, error.empty(), error);
}

Checkpointer::~Checkpointer() = default;

// After step `step` (1-based): whether to write a checkpoint, and whether a signal asks to
// stop; every rank gets rank 0's answer.
Checkpointer::Decision Checkpointer::due(int64_t step) const {
  const TrainConfig& cfg = rt_.cfg;
  dist::Comm& w = *rt_.world;
  // rank 0's clock, any rank's signal, any rank's write still running
  double v[3] = {0, double(stop_signal_received()), pending_ && !pending_->done ? 1.0 : 0.0};
  if (w.rank() == 0) {
    const bool every = cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0;
    const bool timed =
        cfg.checkpoint_every_minutes > 0 && now_seconds() - last_save_ >= 60 * cfg.checkpoint_every_minutes;
    v[0] = every || timed ? 1 : 0;
  }
  if (w.size() > 1) w.all_reduce_sync(v, 3, DType::f64, dist::ReduceOp::max);
  return {v[0] > 0, int(v[1]), pending_ && v[2] == 0};
}

void Checkpointer::step_begins(RunState& run) {
  if (run.step == run.start) last_save_ = now_seconds();
}

void Checkpointer::step_ends(StepDone& d, RunState& run) {
  const int64_t step = d.metrics.step;
  const Decision dec = due(step);
  if (dec.finish) finish();
  const bool last = dec.signal || step == run.total;  // the run ends here: complete before going on
  if (dec.save || last) save(step, run.total, run.result.losses, last), last_save_ = now_seconds();
  if (dec.signal) run.result.stop_signal = dec.signal, run.total = step;
}

void Checkpointer::run_ends(RunState& run) {
  finish();
  TrainResult& r = run.result;
  r.checkpoints = stats_.written, r.checkpoint_seconds = stats_.paused;
  r.checkpoint_write_seconds = stats_.written_seconds;
  r.checkpoint_bytes = stats_.last_bytes, r.last_checkpoint = stats_.last;
}

// The run's position, layout and optimizer as a checkpoint records them.
Manifest Checkpointer::header(int64_t step, int64_t total, const std::vector<double>& losses) const {
  const dist::Mesh& m = *rt_.mesh;
  const TrainConfig& cfg = rt_.cfg;
  const ModelConfig& mc = rt_.mc;
  Manifest man;
  man.model = mc.name;
  man.step = step;
  man.total_steps = total;
  const int64_t per_epoch = BatchLoader::train_steps(rt_.train.size(), cfg.batch, cfg.accum, m.dp(), cfg.last_batch);
  man.epoch = per_epoch > 0 ? step / per_epoch : 0;
  man.step_in_epoch = per_epoch > 0 ? step % per_epoch : step;
  man.global_batch = cfg.global_batch(m.size());
  man.micro_batch = cfg.batch;
  man.accum = cfg.accum;
  man.seed = cfg.seed;
  man.shuffle = cfg.shuffle;
  if (mc.tokens && mc.seq_len != mc.context) man.seq_len = mc.seq_len;
  man.optimizer = rt_.optimizer->config().name;
  man.optimizer_steps = rt_.optimizer->steps();
  man.slots = slot_names(man.optimizer, rt_.params->optimizer_slots());
  man.layout = {m.size(),
                m.dp(),
                m.tp(),
                m.pp(),
                cfg.zero,
                cfg.virtual_stages,
                cfg.sequence_parallel,
                pipe_schedule_name(cfg.pp_schedule),
                m.cp(),
                m.ep()};
  man.losses = losses;
  man.settings = settings_of(rt_.fingerprint);
  man.settings["global_batch"] = std::to_string(man.global_batch);
  return man;
}

// This rank's pieces, copied (the training goes on while they are written): the first
// data-parallel replica's tensor-parallel parts, replicated tensors from tp rank 0. Under
// --ep the first replica's experts live on the first ep data-parallel ranks: each writes its
// own experts (the first everything else too), under their global names.
void Checkpointer::snapshot(CheckpointWrite& p) {
  const dist::Mesh& m = *rt_.mesh;
  rt_.device->to_host(*rt_.params);
  std::unique_ptr<ParamStore> keep;
  const ParamStore& ps = rt_.unsharded(keep);  // ZeRO-3: collective over dp
  const int slots = rt_.params->optimizer_slots();
  // The first replica (its first cp rank); of its expert ranks, the first tp rank (the experts
  // are whole on every tp rank).
  const bool writer = m.cp_rank() == 0 && (m.dp_rank() == 0 || (m.dp_rank() < m.ep() && m.tp_rank() == 0));
  for (int s = 0; s < slots; ++s) p.slots.push_back(full_slot(*rt_.params, s, m.dp_group(), writer));  // collective; a copy
  if (!writer) return;
  auto add = [&](CkptEntry e) {
    const size_t bytes = size_t(Shape(e.shape).numel()) * dtype_size(e.dtype);
    const auto* from = static_cast<const uint8_t*>(e.data);
    p.data.emplace_back(from, from + bytes);
    e.data = p.data.back().data();
    p.entries.push_back(std::move(e));
  };
  p.data.reserve(ps.num_params() * size_t(1 + slots) + ps.num_states());
  for (size_t i = 0; i < ps.num_params(); ++i) {
    const ParamDecl& d = ps.decl(i);
    if (d.shared || (!d.shard.split() && m.tp_rank() != 0) || (!d.expert && m.dp_rank() != 0)) continue;
    add(entry_of("param/" + d.name, d, ps.host_param(i).ptr, DType::f32));
    for (int s = 0; s < slots; ++s)  // already a copy: pointed into, not copied again
      p.entries.push_back(entry_of("optim/" + p.man.slots[size_t(s)] + "/" + d.name, d,
                                   p.slots[size_t(s)].data() + ps.offset(i), DType::f32));
  }
  for (size_t i = 0; m.tp_rank() == 0 && m.dp_rank() == 0 && i < ps.num_states(); ++i) {
    const ParamDecl& d = ps.state_decl(i);
    add(entry_of("state/" + d.name, d, ps.host_state(i).ptr, d.spec.dtype));
  }
  p.writer = true;
}

void Checkpointer::save(int64_t step, int64_t total, const std::vector<double>& losses, bool wait) {
  finish();  // one write at a time
  auto p = std::make_unique<CheckpointWrite>();
  p->started = now_seconds();
  p->root = rt_.cfg.checkpoint_dir;
  p->tmp = temp_checkpoint_dir(p->root, step);
  p->man = header(step, total, losses);
  write(std::move(p), wait);
}

void Checkpointer::save_best(int64_t step, int64_t total, const std::vector<double>& losses, const std::string& dir,
                             const std::string& metric, double value) {
  finish();
  auto p = std::make_unique<CheckpointWrite>();
  p->started = now_seconds();
  const fs::path d = fs::path(dir).lexically_normal();
  const fs::path named = d.has_filename() ? d : d.parent_path();  // "out/best/" is out/best
  p->root = named.has_parent_path() ? named.parent_path().string() : ".";
  p->tmp = (fs::path(p->root) / ("." + named.filename().string() + ".tmp")).string();
  p->dest = named.string();
  p->flag = "--keep-best";
  p->man = header(step, total, losses);
  p->man.best_metric = metric;
  p->man.best_value = value;
  write(std::move(p), true);
}

void Checkpointer::write(std::unique_ptr<CheckpointWrite> p, bool wait) {
  dist::Comm& w = *rt_.world;
  const double t0 = p->started;
  p->step = p->man.step;
  p->data_schema = rt_.train.schema();
  std::string error;
  try {
    if (w.rank() == 0) {
      std::error_code ec;
      fs::create_directories(p->root, ec);
      SAT_CHECK(!ec, p->flag, ": cannot create ", p->root, ": ", ec.message());
      fs::remove_all(p->tmp, ec);
      fs::create_directory(p->tmp, ec);
      SAT_CHECK(!ec, p->flag, ": cannot create ", p->tmp, ": ", ec.message());
    }
  } catch (const Error& e) {
    error = e.what();
  }
  agree(w, error.empty(), error);
  snapshot(*p);
  if (p->writer) {
    CheckpointWrite* q = p.get();
    const int rank = w.rank();
    q->thread = std::thread([q, rank] {
      try {
        char file[64];
        std::snprintf(file, sizeof file, "rank-%05d.safetensors", rank);
        Manifest mine = q->man;
        write_pieces(q->tmp, file, q->entries, mine, q->data_schema);
        mine.parameters = manifest_parameters(mine);
        // The fragment beside it, for rank 0 to merge in rank order.
        std::snprintf(file, sizeof file, "rank-%05d.part.json", rank);
        std::ofstream f(fs::path(q->tmp) / file, std::ios::trunc);
        f << manifest_json(mine);
        f.flush();
        SAT_CHECK(f, q->flag, ": writing ", (fs::path(q->tmp) / file).string(), " failed");
      } catch (const std::exception& e) {
        q->error = e.what();
      }
      q->data.clear();
      q->slots.clear();
      q->done = true;
    });
  } else {
    p->done = true;
  }
  p->paused = now_seconds() - t0;
  pending_ = std::move(p);
  if (wait) finish();
}

// Rank 0's part of finishing: the fragments merged into the manifest, written last, the
// directory renamed into place, old checkpoints pruned.
void Checkpointer::publish(CheckpointWrite& p) {
  Manifest& man = p.man;
  int parts = 0;
  for (int r = 0; r < rt_.world->size(); ++r) {
    char file[64];
    std::snprintf(file, sizeof file, "rank-%05d.part.json", r);
    const fs::path part = fs::path(p.tmp) / file;
    std::error_code ec;
    if (!fs::exists(part, ec)) continue;
    std::ifstream f(part);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    merge_fragment(man, parse_manifest(text, part.string()));
    fs::remove(part, ec);
    ++parts;
  }
  // Published only when complete: every writing rank's file (the first replica's tensor-
  // and pipeline-parallel ranks, under --ep its expert ranks), each of the size its writer recorded.
  const int writers = (rt_.mesh->tp() + rt_.mesh->ep() - 1) * rt_.mesh->pp();
  SAT_CHECK(parts == writers && int(man.files.size()) == writers, p.flag, ": ", p.tmp, " holds ", parts, " of the ",
            writers, " ranks' files: the checkpoint is incomplete (was the directory changed by another program?)");
  for (const auto& [name, f] : man.files) {
    std::error_code ec;
    const auto size = fs::file_size(fs::path(p.tmp) / name, ec);
    SAT_CHECK(!ec && size == f.bytes, p.flag, ": ", (fs::path(p.tmp) / name).string(), " is ",
              ec ? "missing" : str_cat(size, " bytes, its writer wrote ", f.bytes),
              ": the checkpoint is incomplete (was the directory changed by another program?)");
  }
  man.parameters = manifest_parameters(man);
  const fs::path mp = fs::path(p.tmp) / "manifest.json";
  {
    std::ofstream f(mp, std::ios::trunc);
    f << manifest_json(man);
    f.flush();
    SAT_CHECK(f, p.flag, ": writing ", mp.string(), " failed");
  }
  sync_path(mp.string());
  sync_path(p.tmp);
  std::error_code ec;
  const fs::path final_dir = p.dest.empty() ? fs::path(p.root) / checkpoint_name(p.step) : fs::path(p.dest);
  if (!p.dest.empty()) {
    replace_dir(p.tmp, final_dir, p.flag);
  } else {
    fs::remove_all(final_dir, ec);  // the same step written again (a resumed run's last)
    fs::rename(p.tmp, final_dir, ec);
    SAT_CHECK(!ec, "--checkpoint-dir: cannot rename ", p.tmp, " to ", final_dir.string(), ": ", ec.message());
  }
  sync_path(p.root);
  if (p.dest.empty()) prune_checkpoints(p.root, rt_.cfg.checkpoint_keep);
  for (const auto& e : fs::directory_iterator(final_dir, ec)) stats_.last_bytes += double(e.file_size(ec));
}

void Checkpointer::finish() {
  if (!pending_) return;
  std::unique_ptr<CheckpointWrite> p = std::move(pending_);
  if (p->thread.joinable()) p->thread.join();
  dist::Comm& w = *rt_.world;
  agree(w, p->error.empty(), p->error);
  std::string error;
  stats_.last_bytes = 0;
  try {
    if (w.rank() == 0) publish(*p);
  } catch (const Error& e) {
    error = e.what();
  }
  agree(w, error.empty(), error);
  if (!p->dest.empty()) return;  // --keep-best's: not one of the run's checkpoints
  stats_.written += 1;
  stats_.paused += p->paused;
  stats_.written_seconds += now_seconds() - p->started;
  stats_.last = (fs::path(p->root) / checkpoint_name(p->step)).string();
  if (w.rank() == 0 && rt_.cfg.progress != 0)
    std::fprintf(stderr, "checkpoint %s: %s, training paused %.2f s, written in %.2f s\n", stats_.last.c_str(),
                 format_bytes(stats_.last_bytes).c_str(), p->paused, now_seconds() - p->started);
}

ResumeState Checkpointer::load(const std::string& dir, bool weights_only) {
  dist::Comm& w = *rt_.world;
  const ModelConfig& mc = rt_.mc;
  std::string error;
  Manifest man;
  std::vector<SettingChange> changes;
  try {
    man = read_manifest(dir);
    if (w.rank() == 0) verify_checkpoint(dir, man);
    SAT_CHECK(man.model == mc.name, dir, ": a checkpoint of model ", man.model, ", this run trains ", mc.name);
    if (!weights_only) changes = check_resumable(dir, man);
  } catch (const Error& e) {
    error = e.what();
  }
  agree(w, error.empty(), error);
  try {
    load_tensors(dir, man, weights_only);
  } catch (const Error& e) {
    error = e.what();
  }
  agree(w, error.empty(), error);
  if (weights_only) return {};
  rt_.optimizer->set_steps(man.optimizer_steps);
  ResumeState r;
  r.step = man.step;
  r.epoch = man.epoch;
  r.step_in_epoch = man.step_in_epoch;
  r.losses = man.losses;
  r.dir = dir;
  r.changes = std::move(changes);
  return r;
}

// What must hold for a run to go on from a checkpoint (sat::Error naming it): the state
// carries over, the run is longer than the checkpoint, and every setting that differs may
// (train/resume_policy.h). Returns those settings.
std::vector<SettingChange> Checkpointer::check_resumable(const std::string& dir, const Manifest& man) const {
  const dist::Mesh& m = *rt_.mesh;
  const TrainConfig& cfg = rt_.cfg;
  const ModelConfig& mc = rt_.mc;
  const int64_t g = cfg.global_batch(m.size());
  SAT_CHECK(man.global_batch == g, dir, ": written at global batch ", man.global_batch, ", this run's is ", g,
            " (--batch x --accum x data-parallel ranks): the data position would not carry over");
  const std::string opt = rt_.optimizer->config().name;
  SAT_CHECK(man.optimizer == opt, dir, ": written with --optimizer ", man.optimizer, ", this run uses ", opt);
  // Another window cuts the data into other samples: the position would point elsewhere.
  const int64_t window = man.seq_len > 0 ? man.seq_len : mc.context;
  SAT_CHECK(!mc.tokens || window == mc.seq_len, dir, ": written with windows of ", window, " tokens (--seq-len), "
            "this run's are ", mc.seq_len, ": the data position would not carry over");
  const int64_t per_epoch = BatchLoader::train_steps(rt_.train.size(), cfg.batch, cfg.accum, m.dp(), cfg.last_batch);
  const int64_t total = cfg.steps > 0 ? cfg.steps : cfg.epochs * per_epoch;
  SAT_CHECK(total > man.step, cfg.steps > 0 ? str_cat("--steps ", cfg.steps) : str_cat("--epochs ", cfg.epochs, " (",
            total, " steps)"), ": the checkpoint ", dir, " is at step ", man.step, " already; give more ",
            cfg.steps > 0 ? "steps" : "epochs");
  Settings now = settings_of(rt_.fingerprint);
  now["global_batch"] = std::to_string(g);
  const std::vector<SettingChange> changes = resume_changes(
      man.settings, now, std::set<std::string>(cfg.resume_change.begin(), cfg.resume_change.end()), dir);
  // The same data cut the same way: the data position must be the step's.
  const bool same_data = std::none_of(changes.begin(), changes.end(), [](const SettingChange& c) {
    return c.key == "data" || c.key == "train_samples" || c.key == "last_batch";
  });
  const bool position = per_epoch > 0 ? man.epoch == man.step / per_epoch && man.step_in_epoch == man.step % per_epoch
                                      : man.epoch == 0 && man.step_in_epoch == man.step;
  SAT_CHECK(!same_data || position, (fs::path(dir) / "manifest.json").string(), ": the manifest has been edited or "
            "damaged (epoch ", man.epoch, ", step ", man.step_in_epoch, " of it, is not where step ", man.step,
            " is at ", per_epoch, " steps per epoch of ", rt_.train.name(), ")");
  return changes;
}

// The parameters and states (and without weights_only the optimizer state) from the
// checkpoint's logical tensors: each rank keeps its part.
void Checkpointer::load_tensors(const std::string& dir, const Manifest& man, bool weights_only) {
  {
    ParamStore& ps = *rt_.params;
    const Graph& g = *rt_.plan->model.graph;
    std::unique_ptr<ParamStore> full;
    if (ps.sharding().stage >= 3) full = std::make_unique<ParamStore>(g.params(), g.states(), 0, StoreSharding::weights_only());
    read_checkpoint_weights(dir, man, full ? *full : ps);
    if (full) ps.shard_from(*full);  // refreshes the low-precision copy
    else ps.refresh_lp();
    if (weights_only) return;
    const int slots = ps.optimizer_slots();
    const auto names = slot_names(man.optimizer, slots);
    SAT_CHECK(int(names.size()) == slots && man.slots == names, dir, ": optimizer state ",
              man.slots.empty() ? std::string("none") : man.slots.front(), "... does not match this run's optimizer");
    for (int s = 0; s < slots; ++s) {
      std::vector<float> flat(size_t(ps.flat_size()), 0.0f);
      for (size_t i = 0; i < ps.num_params(); ++i) {
        const ParamDecl& d = ps.decl(i);
        if (d.shared) continue;
        const auto bytes =
            read_logical(dir, man, "optim/" + names[size_t(s)] + "/" + d.name, d.full_shape(), DType::f32);
        shard_extract(d, bytes.data(), flat.data() + ps.offset(i));
      }
      set_slot(ps, s, flat);
    }
  }
}

}  // namespace sat
