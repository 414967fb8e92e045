// The resume-compatibility check (src/train/resume_policy.cpp): the input is
//   LIST '\n' RECORD
// where LIST is --resume-change's value and RECORD a settings record in the fingerprint's
// "key=value;" form. The record is compared with a real run's both ways (as the checkpoint's
// and as this run's): each comparison must accept or refuse with sat::Error, never crash;
// an accepted one lists only settings that differ, each once, and a record compared with
// itself changes nothing.
#include <set>
#include <string>

#include "fuzz_util.h"
#include "train/resume_policy.h"

namespace {

// The settings of `saturate train --model mlp --data synthetic --steps 10 --checkpoint-dir D`.
const char* kRun =
    "model=mlp:784-1024-1024-10;model_config=input 784, hidden widths 1024, 1024, 10 classes;vocab=0;seq_len=0;"
    "classes=10;data=synthetic train;normalize=pixels/255;train_samples=10000;test_samples=-1;batch=64;accum=1;"
    "epochs=1;steps=10;optimizer=adamw;lr=0.001;momentum=0;nesterov=0;weight_decay=0.01;betas=0.9,0.999,1e-08;"
    "schedule=cosine;warmup=0,0.05;step_size=0;gamma=0.1;seed=0;shuffle=1;eval=0;tp=1;sequence_parallel=0;"
    "recompute=0;pp=1;pp_schedule=2;virtual_stages=1;pp_split=;last_batch=0;bucket_mb=25;sync_bn=0;zero=0;"
    "noise_scale=0;dist_backend=0;device=auto;precision=fp32;cuda_graph=1;checkpoints=1;global_batch=64";

void compare(const sat::Settings& was, const sat::Settings& now, const std::set<std::string>& allowed) {
  std::vector<sat::SettingChange> changes;
  if (!sat::fuzz::accepts([&] { changes = sat::resume_changes(was, now, allowed, "ck/step-00000010"); })) return;
  std::set<std::string> seen;
  for (const sat::SettingChange& c : changes) {
    sat::fuzz::require(seen.insert(c.key).second, "each setting is reported once");
    const auto a = was.find(c.key), b = now.find(c.key);
    sat::fuzz::require(a == was.end() || b == now.end() || a->second != b->second, "only settings that differ");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 16)) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const size_t nl = text.find('\n');
  const std::string list = nl == std::string::npos ? "" : text.substr(0, nl);
  const std::string record = nl == std::string::npos ? text : text.substr(nl + 1);
  std::set<std::string> allowed;
  if (!list.empty()) sat::fuzz::accepts([&] { allowed = sat::parse_resume_change(list); });
  const sat::Settings run = sat::settings_of(kRun), input = sat::settings_of(record);
  compare(run, input, allowed);
  compare(input, run, allowed);
  std::vector<sat::SettingChange> none;
  sat::fuzz::require(sat::fuzz::accepts([&] { none = sat::resume_changes(input, input, {}, "ck"); }) && none.empty(),
                     "a record compared with itself changes nothing");
  return 0;
}
