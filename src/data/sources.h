// Internal to src/data: the dataset implementations behind open_dataset().
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"

namespace sat::data_detail {

// Pixel conversion table: lut[c*256 + v] = v/255 (float32), or (v/255 - mean[c])/std[c].
// Validates opt.mean/opt.std against C channels (messages name --normalize).
std::vector<float> pixel_lut(int64_t channels, const DataOptions& opt);
std::string scaling_text(const DataOptions& opt);  // "pixels/255" or "(pixels/255 - mean)/std ..."

// Images stored as uint8, N x C x H x W, labels as uint8 class indices.
class U8ImageDataset : public Dataset {
 public:
  U8ImageDataset(std::string name, Shape chw, int64_t classes, std::vector<uint8_t> pixels,
                 std::vector<uint8_t> labels, std::vector<float> lut, std::string scaling);
  int64_t size() const override { return int64_t(labels_.size()); }
  Shape sample_shape() const override { return chw_; }
  DType sample_dtype() const override { return DType::f32; }
  Shape label_shape() const override { return Shape{}; }
  int64_t num_classes() const override { return classes_; }
  void get(int64_t i, void* x, int32_t* y) const override;
  std::string name() const override { return name_; }
  std::string scaling() const override { return scaling_; }
  size_t storage_bytes() const override { return pixels_.size() + labels_.size(); }

 private:
  std::string name_;
  Shape chw_;
  int64_t classes_;
  std::vector<uint8_t> pixels_;  // N*C*H*W
  std::vector<uint8_t> labels_;  // N
  std::vector<float> lut_;       // C*256
  std::string scaling_;          // scaling_text of the options that made lut_
};

DataSplit open_idx(const std::string& tag, const std::string& dir, bool is_default_dir, const DataOptions& opt);
DataSplit open_cifar10(const std::string& dir, const DataOptions& opt);
// --data tokens:TRAIN[:VAL] (token_shards.cpp): each part a file, a glob or a directory.
DataSplit open_tokens(const std::string& train_spec, const std::string& val_spec, const DataOptions& opt);
// A gzip-compressed token shard (readers.cpp), decompressed whole: its header is read and
// payload_bytes(header) (which throws on a bad header) says how many bytes of tokens
// follow; they are checked against free memory and the gzip data before being allocated,
// and the data must end there. Returns the tokens' bytes.
std::vector<uint8_t> read_gzip_token_shard(const std::string& path,
                                           const std::function<uint64_t(const int32_t* header)>& payload_bytes);
// --val-fraction (tables, image folders): the last round(F x N) of a permutation seeded by
// `seed` are the test split, the rest the training split, each in the original order. `what`
// names the N things in the message when none would be left to train on ("rows of FILE").
std::pair<std::vector<int64_t>, std::vector<int64_t>> hold_out(int64_t n, double fraction, uint64_t seed,
                                                               const std::string& what);
DataSplit open_synthetic_images(Shape chw, int64_t classes, const DataOptions& opt);
DataSplit open_synthetic_tokens(const DataOptions& opt);

}  // namespace sat::data_detail
