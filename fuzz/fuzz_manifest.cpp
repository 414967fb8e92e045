// Checkpoint manifests through parse_manifest (src/train/checkpoint.cpp): an accepted
// manifest must write (manifest_json) and read back to the same text; and the checkpoint
// directory it would describe, with the input as its manifest and one small shard file,
// must be verified and read (read_logical) or refused, never crash. A manifest whose
// checksum does not match is refused before its keys are read: so that the fuzzer reaches
// them (and the checks of the fields against each other), an input that is a JSON object is
// also tried with its checksum made to match. Corpus: the manifests of two real runs (mlp
// with AdamW; a 2-rank tensor-parallel GPT) and damaged copies of them (fuzz/make_corpus.py).
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_util.h"
#include "train/checkpoint.h"

namespace {

void one(const std::string& text);

// The input with the checksum its content has ("" when it is not a JSON object).
std::string resealed(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return "";
  j["checksum"] = sat::manifest_checksum(text);
  return j.dump(1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 16)) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  one(text);
  const std::string sealed = resealed(text);
  if (!sealed.empty() && sealed != text) one(sealed);
  return 0;
}

namespace {

void one(const std::string& text) {
  sat::Manifest m;
  if (!sat::fuzz::accepts([&] { m = sat::parse_manifest(text, "manifest.json"); })) return;
  const std::string out = sat::manifest_json(m);
  sat::Manifest again;
  sat::fuzz::require(sat::fuzz::accepts([&] { again = sat::parse_manifest(out, "manifest.json"); }),
                     "manifest_json parses back");
  sat::fuzz::require(sat::manifest_json(again) == out, "manifest_json round-trips");
  // Every tensor it names, read from a directory holding it and an empty-ish shard.
  sat::fuzz::TempDir dir;
  std::ofstream(dir.file("manifest.json"), std::ios::binary) << text;
  std::ofstream(dir.file("rank-00000.safetensors"), std::ios::binary) << std::string("\x10\0\0\0\0\0\0\0{}              ", 24);
  sat::fuzz::accepts([&] { sat::verify_checkpoint(dir.path(), m); });
  for (const auto& entry : m.tensors) {
    const std::string& name = entry.first;
    const auto& t = entry.second;
    if (t.shape.size() > size_t(sat::Shape::kMaxDims)) continue;
    const sat::Shape shape(t.shape);
    if (shape.numel() > (1 << 20)) continue;  // the reader checks the shape against the model's first
    sat::fuzz::accepts([&] { sat::read_logical(dir.path(), m, name, shape, sat::DType::f32); });
  }
}

}  // namespace
