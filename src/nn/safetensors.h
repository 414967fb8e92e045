// The safetensors format, one codec for model weights and checkpoints (train/checkpoint.h),
// and parameters and model state (BatchNorm running statistics) as safetensors files with
// PyTorch's names and layouts (a state_dict without the tied lm_head.weight).
//
// Format: u64 little-endian N, an N-byte JSON header (padded with spaces to a multiple of 8
// bytes), then the tensors' raw little-endian bytes. The header maps each tensor's name to
// {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]} (END - BEGIN bytes from
// BEGIN, counted from the start of the data) and "__metadata__" to a map of strings.
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "nn/params.h"

namespace sat {

// The format's name of a dtype: "F32", "I64", "BF16", ...
const char* safetensors_dtype(DType t);

// ---- the codec ----------------------------------------------------------------------------

// One tensor of a file's header.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // the format's name ("F32", "BF16", "BOOL", ...)
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // [begin, end) within the data
};

using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;
// The metadata key under which weights and checkpoints keep the training data's schema
// (Dataset::schema(), data/dataset.h), when it has one.
inline constexpr const char* kDataSchemaKey = "data_schema";

// A tensor to write: `data` holds numel(shape) elements of `dtype`.
struct SafetensorsBlob {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes a safetensors file's bytes through `write` (called with consecutive pieces: the
// length, the header, each tensor's data in the order given, one after another), and
// returns how many bytes that was. The caller owns the file (atomic replacement, fsync, a
// checksum of what passes by).
uint64_t write_safetensors(const std::vector<SafetensorsBlob>& tensors, const SafetensorsMetadata& metadata,
                           const std::function<void(const void*, size_t)>& write);

// A safetensors file opened for reading: its header read and checked against damage, every
// problem a sat::Error naming the file (and the tensor): shorter than 8 bytes; a header
// length beyond the file or over 100 MiB; a header that is not a JSON object, or that has
// the same name twice; an entry without a known dtype, a shape of whole numbers (at most
// Shape::kMaxDims of them, each at most 2^40) or two whole-number data offsets within the
// data; offsets whose span is not numel x the dtype's size; tensors that overlap; metadata
// that is not strings.
class SafetensorsFile {
 public:
  // Opened as core/io.h's InputFile: a FIFO or device is refused at once.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // in header order
  const SafetensorsTensor* find(const std::string& name) const;                // nullptr when absent
  const SafetensorsMetadata& metadata() const { return metadata_; }
  // Reads t's end - begin bytes into dst (sat::Error naming the file and tensor when it
  // cannot).
  void read(const SafetensorsTensor& t, void* dst);

 private:
  std::string path_;
  int fd_ = -1;
  // Reads n bytes at `offset` of the file; false when it ends first or a read fails.
  bool read_at(uint64_t offset, void* dst, uint64_t n) const;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  SafetensorsMetadata metadata_;
};

// ---- model weights --------------------------------------------------------------------

// Writes atomically (core/io.h: a unique temporary file beside it, fsynced and renamed), so an existing file is never lost
// to a failed write.
// Writes the host copies: on the GPU, call ps.sync_to_host() first. `extra`: metadata
// beside format, producer and model (the training data's schema: data/csv.h).
void save_safetensors(const std::string& path, const ParamStore& ps, const std::string& model_name,
                      const SafetensorsMetadata& extra = {});
// Loads every parameter and state tensor; a missing tensor, a wrong shape or dtype,
// an unknown tensor name or a corrupt file is a sat::Error naming the file. A pipeline
// stage's store holds part of the model: given the names of the whole model's
// parameters and states, the file's tensors of other stages are skipped. A tensor-parallel
// part (ParamDecl::shard) is read from the file's full tensor.
void load_safetensors(const std::string& path, ParamStore& ps, const std::set<std::string>* model_names = nullptr);

}  // namespace sat
