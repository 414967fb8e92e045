#include "train/resume_policy.h"

#include <algorithm>

#include "core/error.h"

namespace sat {

namespace {

enum class May { change, when_named, never };

struct Policy {
  const char* key;   // the fingerprint's field
  const char* flag;  // how the user sets it, for messages
  May may;
  const char* name;  // --resume-change's name for it (when_named), or why not (never)
  bool on_off = false;
  const char* absent = nullptr;  // its value in a checkpoint that does not record it (null: none)
};

// Every field of config_fingerprint, and the global batch.
constexpr Policy kPolicies[] = {
    {"model", "--model", May::when_named, "model"},
    {"model_config", "--model", May::when_named, "model"},
    {"vocab", "--vocab", May::when_named, "model"},
    {"seq_len", "--seq-len", May::when_named, "model"},
    {"classes", "classes (of --data)", May::when_named, "model"},
    {"data", "--data", May::when_named, "data"},
    {"train_samples", "training samples (of --data)", May::when_named, "data"},
    {"normalize", "--normalize", May::when_named, "normalize"},
    {"last_batch", "--last-batch", May::when_named, "last_batch"},
    {"seed", "--seed", May::when_named, "seed"},
    {"shuffle", "--shuffle", May::when_named, "shuffle", true},
    {"lr", "--lr", May::when_named, "lr"},
    {"momentum", "--momentum", May::when_named, "momentum"},
    {"nesterov", "--nesterov", May::when_named, "nesterov", true},
    {"weight_decay", "--weight-decay", May::when_named, "weight_decay"},
    {"betas", "--betas,--eps", May::when_named, "betas"},
    // (a checkpoint written before these two were recorded trained without them)
    {"clip_grad_norm", "--clip-grad-norm", May::when_named, "clip_grad_norm", false, "off"},
    {"schedule", "--schedule", May::when_named, "schedule"},
    {"warmup", "--warmup", May::when_named, "warmup"},
    {"step_size", "--step-size", May::when_named, "step_size"},
    {"gamma", "--gamma", May::when_named, "gamma"},
    {"min_lr", "--min-lr", May::when_named, "min_lr", false, "0"},
    {"sync_bn", "--sync-bn", May::when_named, "sync_bn", true},
    {"precision", "--precision", May::when_named, "precision"},
    {"optimizer", "--optimizer", May::never, "the optimizer's state would not carry over"},
    {"global_batch", "global batch (--batch x --accum x data-parallel ranks)", May::never,
     "the data position would not carry over"},
    // The run's length (it may grow: train/checkpointer.cpp refuses one that ends before
    // the checkpoint), the layout, evaluation, the device and the checkpoints' cadence.
    {"steps", "--steps", May::change, ""},
    {"epochs", "--epochs", May::change, ""},
    {"test_samples", "test samples (of --data)", May::change, ""},
    {"eval", "--eval", May::change, "", true},
    {"batch", "--batch", May::change, ""},
    {"accum", "--accum", May::change, ""},
    {"tp", "--tp", May::change, ""},
    {"ep", "--ep", May::change, "", false, "1"},
    {"sequence_parallel", "--sequence-parallel", May::change, "", true},
    {"recompute", "--recompute", May::change, ""},
    {"pp", "--pp", May::change, ""},
    {"pp_schedule", "--pp-schedule", May::change, ""},
    {"virtual_stages", "--virtual-stages", May::change, ""},
    {"pp_split", "--pp-split", May::change, ""},
    {"bucket_mb", "--bucket-mb", May::change, ""},
    {"zero", "--zero", May::change, ""},
    {"noise_scale", "--noise-scale", May::change, "", true},
    {"dist_backend", "--dist-backend", May::change, ""},
    {"device", "--device", May::change, ""},
    {"cuda_graph", "--cuda-graph", May::change, "", true},
    {"checkpoints", "--checkpoint-dir", May::change, "", true},
    {"eval_every", "--eval-every", May::change, ""},
    {"eval_batches", "--eval-batches", May::change, ""},
    {"keep_best", "--keep-best", May::change, ""},
};

const Policy* policy_of(const std::string& key) {
  for (const Policy& p : kPolicies)
    if (key == p.key) return &p;
  return nullptr;
}

// The names --resume-change takes, for its messages.
std::string named_settings() {
  std::vector<std::string> names;
  for (const Policy& p : kPolicies)
    if (p.may == May::when_named && std::find(names.begin(), names.end(), p.name) == names.end()) names.push_back(p.name);
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string shown(const Policy* p, const std::string& v, bool present) {
  if (!present) return "(not recorded)";
  if (p && p->on_off && (v == "1" || v == "0")) return v == "1" ? "on" : "off";
  return v.empty() ? "(none)" : v;
}

}  // namespace

Settings settings_of(const std::string& fp) {
  Settings s;
  size_t pos = 0;
  while (pos < fp.size()) {
    const size_t end = std::min(fp.find(';', pos), fp.size());
    const size_t eq = fp.find('=', pos);
    if (eq < end) s[fp.substr(pos, eq - pos)] = fp.substr(eq + 1, end - eq - 1);
    pos = end + 1;
  }
  return s;
}

std::set<std::string> parse_resume_change(const std::string& list) {
  std::set<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t end = std::min(list.find(',', pos), list.size());
    std::string name = list.substr(pos, end - pos);
    std::replace(name.begin(), name.end(), '-', '_');
    SAT_CHECK(!name.empty(), "--resume-change ", list, ": expected setting names separated by commas, from ",
              named_settings());
    bool known = false;
    for (const Policy& p : kPolicies) {
      if (name != p.name && name != p.key) continue;
      SAT_CHECK(p.may != May::never, "--resume-change: ", p.key, " cannot change on resume: ", p.name);
      known = true;
      if (p.may == May::when_named) out.insert(p.name);
    }
    SAT_CHECK(known, "--resume-change: '", name, "' is not a setting a resumed run may change; expected names from ",
              named_settings(), " (separated by commas)");
    pos = end + 1;
  }
  return out;
}

std::vector<SettingChange> resume_changes(const Settings& was, const Settings& now, const std::set<std::string>& allowed,
                                          const std::string& where) {
  std::set<std::string> keys;
  for (const auto& kv : was) keys.insert(kv.first);
  for (const auto& kv : now) keys.insert(kv.first);
  std::vector<SettingChange> out;
  for (const std::string& key : keys) {
    const Policy* p = policy_of(key);
    const auto a = was.find(key), b = now.find(key);
    const bool in_b = b != now.end(), in_a = a != was.end() || (p && p->absent);
    const std::string va = a != was.end() ? a->second : in_a ? p->absent : "", vb = in_b ? b->second : "";
    if (in_a && in_b && va == vb) continue;
    const std::string from = shown(p, va, in_a), to = shown(p, vb, in_b);
    SAT_CHECK(p, "--resume: the checkpoint ", where, " records the setting '", key, "' as ", from, "; this run has ", to,
              " (a checkpoint of another saturate?)");
    const std::string both = str_cat("--resume: the checkpoint ", where, " was trained with ", p->flag, " ", from,
                                     "; this run has ", p->flag, " ", to);
    SAT_CHECK(p->may != May::never, both, " (", p->name, ")");
    SAT_CHECK(p->may == May::change || allowed.count(p->name), both, " (add --resume-change ", p->name,
              " to change it)");
    out.push_back({key, from, to});
  }
  return out;
}

}  // namespace sat
