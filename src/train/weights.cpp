// Weights in and out of a running job: a safetensors file (PyTorch's parameter names) read
// into every rank's part of the model, and the whole model gathered from the stages,
// tensor-parallel parts and expert ranks onto global rank 0 and written there.
#include "train/weights.h"

#include <filesystem>
#include <set>

#include "core/io.h"

#include "dist/verdict.h"
#include "nn/safetensors.h"
#include "nn/shard.h"
#include "train/agree.h"
#include "train/checkpoint.h"

namespace sat {

void load_weights(RankRuntime& rt, const std::string& path) {
  const dist::Mesh& m = *rt.mesh;
  // Names of the whole model, every expert's: a stage skips the tensors of the others, an
  // expert rank those of the experts it does not hold.
  const Graph& whole = *rt.job->unsplit().graph;
  std::set<std::string> names;
  for (auto& p : whole.params()) names.insert(p.name);
  for (auto& s : whole.states()) names.insert(s.name);
  const bool part = m.pp() > 1 || m.ep() > 1;
  if (rt.params->sharding().stage >= 3) {  // read in full, keep the pieces
    const Graph& g = *rt.plan->model.graph;
    ParamStore full(g.params(), g.states(), 0);
    dist::on_every_rank(*rt.world, [&] { load_safetensors(path, full, part ? &names : nullptr); });
    agree_on_replicas(*rt.world, rt.replica_group(), store_checksum(full), "--init-weights " + path);
    rt.broadcast_store(full);
    rt.params->shard_from(full);
    return;
  }
  // Each rank reads its own file (a node's copy can be missing or damaged): a verdict first.
  dist::on_every_rank(*rt.world, [&] { load_safetensors(path, *rt.params, part ? &names : nullptr); });
  // Before the broadcast, which would hide it: a rank that read another file of that name.
  agree_on_replicas(*rt.world, rt.replica_group(), store_checksum(*rt.params), "--init-weights " + path);
  rt.broadcast_store(*rt.params);
  rt.params->refresh_lp();
}

namespace {

// Declarations of the full tensors of (possibly tensor-parallel) parameters.
std::vector<ParamDecl> full_decls(const std::vector<ParamDecl>& ps) {
  std::vector<ParamDecl> out = ps;
  for (auto& d : out) {
    d.spec.shape = d.full_shape();
    d.shard = {};
  }
  return out;
}

// This stage's parameters as full tensors on the tensor-parallel group's first rank
// (collective over the group; nullptr elsewhere): each split parameter's parts are
// all-gathered and put in their places.
std::unique_ptr<ParamStore> gather_tensor_parallel(const RankRuntime& rt, const ParamStore& mine) {
  dist::Comm& tp = rt.mesh->tp_group();
  const bool root = tp.rank() == 0;
  const Graph& g = *rt.plan->model.graph;
  auto out = root ? std::make_unique<ParamStore>(full_decls(g.params()), g.states(), 0, StoreSharding::weights_only()) : nullptr;
  std::vector<float> parts;
  for (size_t i = 0; i < mine.num_params(); ++i) {
    const ParamDecl& d = mine.decl(i);
    Tensor local = mine.host_param(i);
    if (d.shard.split()) {  // collective: every rank of the group takes part
      parts.resize(size_t(local.numel() * tp.size()));
      tp.all_gather(local.ptr, parts.data(), size_t(local.numel()), DType::f32)->wait();
    }
    if (!root) continue;
    Tensor full = out->host_param(i);
    if (!d.shard.split()) std::copy(local.f32(), local.f32() + local.numel(), full.f32());
    else
      for (int r = 0; r < tp.size(); ++r) shard_insert_part(d, r, parts.data() + r * local.numel(), full.ptr);
  }
  for (size_t i = 0; root && i < mine.num_states(); ++i) {
    Tensor src = mine.host_state(i), dst = out->host_state(i);
    std::copy(src.u8(), src.u8() + src.bytes(), dst.u8());
  }
  return out;
}

// The whole model on global rank 0: the tensor-parallel parts of each stage of the first
// data-parallel replica are gathered on its first tp rank, which sends the stage's full
// tensors there. nullptr on other ranks (and on rank 0 when its own store is the model).
std::unique_ptr<ParamStore> gather_whole_model(RankRuntime& rt, const ParamStore& own) {
  const dist::Mesh& m = *rt.mesh;
  if (m.dp_rank() != 0 || m.cp_rank() != 0) return nullptr;  // --cp: the first cp rank's copy
  std::unique_ptr<ParamStore> stage = m.tp() > 1 ? gather_tensor_parallel(rt, own) : nullptr;
  if (m.tp_rank() != 0 || m.pp() == 1) return stage;
  const ParamStore& mine = stage ? *stage : own;
  dist::Comm& pp = m.pp_group();
  if (m.pp_rank() != 0) {
    pp.send(mine.host_flat_params(), size_t(mine.flat_size()), DType::f32, 0)->wait();
    for (size_t i = 0; i < mine.num_states(); ++i) {
      Tensor t = mine.host_state(i);
      pp.send(t.ptr, t.bytes(), DType::u8, 0)->wait();
    }
    return nullptr;
  }
  const Graph& whole = *rt.job->whole().graph;
  auto out = std::make_unique<ParamStore>(full_decls(whole.params()), whole.states(), 0, StoreSharding::weights_only());
  auto copy_in = [&](const ParamStore& from) {
    for (size_t i = 0; i < from.num_params(); ++i) {
      const int k = out->find_param(from.decl(i).name);
      Tensor src = from.host_param(i), dst = out->host_param(size_t(k));
      std::copy(src.f32(), src.f32() + src.numel(), dst.f32());
    }
    for (size_t i = 0; i < from.num_states(); ++i) {
      Tensor src = from.host_state(i), dst = out->host_state(size_t(out->find_state(from.state_decl(i).name)));
      std::copy(src.u8(), src.u8() + src.bytes(), dst.u8());
    }
  };
  for (int s = m.pp() - 1; s >= 0; --s) {  // stage 0 last: its copy of a tied weight wins
    if (s == 0) {
      copy_in(mine);
      continue;
    }
    const RankPlan& other = rt.job->stage(s);
    const Graph& og = *other.model.graph;
    ParamStore ps(full_decls(og.params()), og.states(), 0, StoreSharding::weights_only());
    pp.recv(ps.flat_params(), size_t(ps.flat_size()), DType::f32, s)->wait();
    for (size_t i = 0; i < ps.num_states(); ++i) {
      Tensor t = ps.host_state(i);
      pp.recv(t.ptr, t.bytes(), DType::u8, s)->wait();
    }
    copy_in(ps);
  }
  return out;
}

// Under --ep: the first replica's other expert ranks (dp 1 .. ep-1; tp 0 and cp 0: the experts
// are whole on every tp rank) send their experts, by name, to global rank 0, which puts them
// with the model it gathered (`mine`: its own experts only) in a store of the unsplit model,
// every expert in its one-process place. Collective over those ranks; nullptr elsewhere.
std::unique_ptr<ParamStore> gather_experts(RankRuntime& rt, const ParamStore& own, const ParamStore* whole) {
  const dist::Mesh& m = *rt.mesh;
  dist::Comm& w = *rt.world;
  constexpr int kTag = 0x5e9;
  if (m.cp_rank() == 0 && m.tp_rank() == 0 && m.dp_rank() > 0 && m.dp_rank() < m.ep()) {
    std::string names;
    std::vector<float> data;
    for (size_t i = 0; i < own.num_params(); ++i) {
      if (!own.decl(i).expert) continue;
      names += own.decl(i).name + "\n";
      const Tensor t = own.host_param(i);
      data.insert(data.end(), t.f32(), t.f32() + t.numel());
    }
    const int64_t sizes[2] = {int64_t(names.size()), int64_t(data.size())};
    w.send(sizes, 2, DType::i64, 0, kTag)->wait();
    w.send(names.data(), names.size(), DType::u8, 0, kTag)->wait();
    w.send(data.data(), data.size(), DType::f32, 0, kTag)->wait();
  }
  if (w.rank() != 0) return nullptr;
  const Graph& one = *rt.job->unsplit().graph;
  auto out = std::make_unique<ParamStore>(full_decls(one.params()), one.states(), 0);
  auto put = [&](const std::string& name, const float* v, int64_t n) {
    const int k = out->find_param(name);
    SAT_CHECK(k >= 0 && out->host_param(size_t(k)).numel() == n, "internal error: no expert parameter ", name);
    std::copy(v, v + n, out->host_param(size_t(k)).f32());
  };
  const ParamStore& from = whole ? *whole : own;
  for (size_t i = 0; i < from.num_params(); ++i) put(from.decl(i).name, from.host_param(i).f32(), from.host_param(i).numel());
  for (size_t i = 0; i < from.num_states(); ++i) {
    Tensor src = from.host_state(i), dst = out->host_state(size_t(out->find_state(from.state_decl(i).name)));
    std::copy(src.u8(), src.u8() + src.bytes(), dst.u8());
  }
  for (int q = 1; q < m.ep(); ++q)
    for (int s = 0; s < m.pp(); ++s) {
      const int peer = m.global_rank(0, q, s);
      int64_t sizes[2];
      w.recv(sizes, 2, DType::i64, peer, kTag)->wait();
      std::string names(static_cast<size_t>(sizes[0]), '\0');
      std::vector<float> data(static_cast<size_t>(sizes[1]));
      w.recv(names.data(), names.size(), DType::u8, peer, kTag)->wait();
      w.recv(data.data(), data.size(), DType::f32, peer, kTag)->wait();
      size_t at = 0, pos = 0;
      for (size_t end; (end = names.find('\n', pos)) != std::string::npos; pos = end + 1) {
        const std::string name = names.substr(pos, end - pos);
        const int k = out->find_param(name);
        const int64_t n = k >= 0 ? out->host_param(size_t(k)).numel() : 0;
        SAT_CHECK(at + size_t(n) <= data.size(), "internal error: expert parameter ", name, " out of the data sent");
        put(name, data.data() + at, n);
        at += size_t(n);
      }
    }
  return out;
}

}  // namespace

void save_weights(RankRuntime& rt, const std::string& path) {
  std::unique_ptr<ParamStore> full;
  const ParamStore& own = rt.unsharded(full);
  std::unique_ptr<ParamStore> whole = gather_whole_model(rt, own);
  if (rt.mesh->ep() > 1) whole = gather_experts(rt, own, whole.get());
  if (rt.world->rank() != 0) return;
  const std::string schema = rt.train.schema();
  save_safetensors(path, whole ? *whole : own, rt.mc.name,
                   schema.empty() ? SafetensorsMetadata{} : SafetensorsMetadata{{kDataSchemaKey, schema}});
}

std::string saved_data_schema(const std::string& path) {
  try {
    std::string file = path;
    if (std::filesystem::is_directory(path)) {  // a checkpoint: every rank's file carries it
      const std::string dir = resolve_checkpoint(path, "--init-weights");
      const Manifest m = read_manifest(dir);
      if (m.files.empty()) return "";
      file = (std::filesystem::path(dir) / m.files.begin()->first).string();
    }
    const SafetensorsFile f(file);
    for (const auto& [key, value] : f.metadata())
      if (key == kDataSchemaKey) return value;
  } catch (const Error&) {  // loading the weights reports it
  }
  return "";
}

void read_checkpoint_weights(const std::string& dir, const Manifest& m, ParamStore& into) {
  for (size_t i = 0; i < into.num_params(); ++i) {
    const ParamDecl& d = into.decl(i);
    if (d.shared) continue;
    const auto bytes = read_logical(dir, m, "param/" + d.name, d.full_shape(), DType::f32);
    shard_extract(d, bytes.data(), into.host_param(i).ptr);
  }
  for (size_t i = 0; i < into.num_states(); ++i) {
    const ParamDecl& d = into.state_decl(i);
    const auto bytes = read_logical(dir, m, "state/" + d.name, d.spec.shape, d.spec.dtype);
    std::copy(bytes.begin(), bytes.end(), static_cast<uint8_t*>(into.host_state(i).ptr));
  }
}

void load_weights_into(ParamStore& ps, const std::string& path, const std::string& model_name) {
  check_input_path("--init-weights", path, true);  // a FIFO or device: refused, not waited on
  if (!std::filesystem::is_directory(path)) {
    load_safetensors(path, ps);
  } else {
    const std::string dir = resolve_checkpoint(path, "--init-weights");
    const Manifest m = read_manifest(dir);
    verify_checkpoint(dir, m);
    SAT_CHECK(m.model == model_name, dir, ": a checkpoint of model ", m.model, ", not of --model ", model_name);
    read_checkpoint_weights(dir, m, ps);
  }
  ps.refresh_lp();
}

}  // namespace sat
