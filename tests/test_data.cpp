// Data: IDX / CIFAR-10 / token-shard readers on small files written here, the real
// Fashion-MNIST files when installed, normalization, synthetic data, and the loader
// (order, padding, prefetch thread == synchronous read, counted buffers, errors).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "core/alloc.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "data/loader.h"

namespace fs = std::filesystem;
using namespace sat;

namespace {

// A fresh temporary directory per test, removed afterwards.
class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / str_cat("sat_test_data_", getpid(), "_", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

void write_file(const std::string& path, const std::vector<uint8_t>& bytes, bool gz) {
  if (gz) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    if (!bytes.empty()) {
      ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
    }
    gzclose(f);
  } else {
    std::ofstream o(path, std::ios::binary);
    o.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
}

void put_be32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(uint8_t(x >> s));
}

// IDX image file: n images of h x w, pixel(i, r, c) = (i*31 + r*7 + c*3) % 256.
std::vector<uint8_t> idx_images(uint32_t n, uint32_t h, uint32_t w, uint32_t magic = 2051) {
  std::vector<uint8_t> v;
  put_be32(v, magic);
  put_be32(v, n);
  put_be32(v, h);
  put_be32(v, w);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t r = 0; r < h; ++r)
      for (uint32_t c = 0; c < w; ++c) v.push_back(uint8_t((i * 31 + r * 7 + c * 3) % 256));
  return v;
}
uint8_t idx_pixel(int64_t i, int64_t r, int64_t c) { return uint8_t((i * 31 + r * 7 + c * 3) % 256); }

std::vector<uint8_t> idx_labels(const std::vector<uint8_t>& labels, uint32_t magic = 2049) {
  std::vector<uint8_t> v;
  put_be32(v, magic);
  put_be32(v, uint32_t(labels.size()));
  v.insert(v.end(), labels.begin(), labels.end());
  return v;
}

// A small MNIST-style directory: train 5 images 3x4 (plain), test 3 images (gzip).
void write_mnist_dir(const fs::path& d, bool train_gz, bool test_gz) {
  write_file((d / (train_gz ? "train-images-idx3-ubyte.gz" : "train-images-idx3-ubyte")).string(),
             idx_images(5, 3, 4), train_gz);
  write_file((d / (train_gz ? "train-labels-idx1-ubyte.gz" : "train-labels-idx1-ubyte")).string(),
             idx_labels({9, 0, 3, 7, 1}), train_gz);
  write_file((d / (test_gz ? "t10k-images-idx3-ubyte.gz" : "t10k-images-idx3-ubyte")).string(),
             idx_images(3, 3, 4), test_gz);
  write_file((d / (test_gz ? "t10k-labels-idx1-ubyte.gz" : "t10k-labels-idx1-ubyte")).string(),
             idx_labels({2, 4, 6}), test_gz);
}

// Expects fn to throw sat::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected sat::Error containing '" << *parts.begin() << "'";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}

std::vector<float> get_x(const Dataset& ds, int64_t i, std::vector<int32_t>* y = nullptr) {
  std::vector<float> x(size_t(ds.sample_shape().numel()));
  std::vector<int32_t> yy(size_t(ds.label_numel()));
  ds.get(i, x.data(), yy.data());
  if (y) *y = yy;
  return x;
}

DataOptions image_opts() { return DataOptions{}; }

DataOptions token_opts(int64_t T, int64_t vocab) {
  DataOptions o;
  o.model_takes_tokens = true;
  o.seq_len = T;
  o.vocab = vocab;
  return o;
}

}  // namespace

// ------------------------------------------------------------------------- IDX

TEST_F(DataTest, IdxPlainAndGzipReadTheSame) {
  for (int variant = 0; variant < 2; ++variant) {
    fs::path d = dir_ / str_cat("v", variant);
    fs::create_directories(d);
    write_mnist_dir(d, variant == 1, variant == 0);  // one split gzip, the other plain
    DataSplit s = open_dataset("mnist:" + d.string(), image_opts());
    ASSERT_TRUE(s.train && s.test);
    EXPECT_EQ(s.train->size(), 5);
    EXPECT_EQ(s.test->size(), 3);
    EXPECT_EQ(s.train->sample_shape(), (Shape{1, 3, 4}));
    EXPECT_EQ(s.train->sample_dtype(), DType::f32);
    EXPECT_EQ(s.train->label_shape(), Shape{});
    EXPECT_EQ(s.train->num_classes(), 10);
    EXPECT_FALSE(s.train->is_tokens());
    const int train_labels[] = {9, 0, 3, 7, 1}, test_labels[] = {2, 4, 6};
    for (int i = 0; i < 5; ++i) {
      std::vector<int32_t> y;
      auto x = get_x(*s.train, i, &y);
      EXPECT_EQ(y[0], train_labels[i]);
      for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 4; ++c) EXPECT_EQ(x[size_t(r * 4 + c)], float(idx_pixel(i, r, c)) / 255.0f);
    }
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> y;
      auto x = get_x(*s.test, i, &y);
      EXPECT_EQ(y[0], test_labels[i]);
      EXPECT_EQ(x[5], float(idx_pixel(i, 1, 1)) / 255.0f);
    }
    EXPECT_NE(s.description.find("5 train / 3 test"), std::string::npos) << s.description;
  }
}

TEST_F(DataTest, IdxErrorsNameTheFile) {
  // Missing files: the message names the file looked for.
  expect_error([&] { open_dataset("mnist:" + path("nowhere"), image_opts()); },
               {"train-images-idx3-ubyte.gz", "not found", "nowhere"});
  // Fashion-MNIST missing: names the Debian package.
  expect_error([&] { open_dataset("fashion-mnist:" + path("nowhere"), image_opts()); },
               {"train-images-idx3-ubyte.gz", "dataset-fashion-mnist"});

  write_mnist_dir(dir_, false, false);
  const std::string spec = "mnist:" + dir_.string();
  open_dataset(spec, image_opts());  // valid as written

  // Wrong magic: a label file where images are expected.
  write_file(path("train-images-idx3-ubyte"), idx_labels({1, 2, 3, 4, 5}), false);
  expect_error([&] { open_dataset(spec, image_opts()); }, {path("train-images-idx3-ubyte"), "2049", "expected 2051"});
  write_file(path("train-images-idx3-ubyte"), idx_images(5, 3, 4), false);
  write_file(path("train-labels-idx1-ubyte"), idx_images(5, 3, 4), false);
  expect_error([&] { open_dataset(spec, image_opts()); }, {path("train-labels-idx1-ubyte"), "expected 2049"});

  // Truncated pixel data (plain).
  auto img = idx_images(5, 3, 4);
  img.erase(img.end() - 7, img.end());
  write_file(path("train-labels-idx1-ubyte"), idx_labels({9, 0, 3, 7, 1}), false);
  write_file(path("train-images-idx3-ubyte"), img, false);
  expect_error([&] { open_dataset(spec, image_opts()); }, {path("train-images-idx3-ubyte"), "truncated"});

  // Truncated header.
  write_file(path("train-images-idx3-ubyte"), {0, 0, 8}, false);
  expect_error([&] { open_dataset(spec, image_opts()); }, {path("train-images-idx3-ubyte"), "truncated"});

  // Trailing bytes beyond what the header says.
  img = idx_images(5, 3, 4);
  img.push_back(1);
  write_file(path("train-images-idx3-ubyte"), img, false);
  expect_error([&] { open_dataset(spec, image_opts()); }, {path("train-images-idx3-ubyte"), "more data"});

  // Image / label count mismatch names both files.
  write_file(path("train-images-idx3-ubyte"), idx_images(4, 3, 4), false);
  expect_error([&] { open_dataset(spec, image_opts()); },
               {path("train-images-idx3-ubyte"), path("train-labels-idx1-ubyte"), "4 images", "5 labels"});

  // Label out of range.
  write_file(path("train-images-idx3-ubyte"), idx_images(5, 3, 4), false);
  write_file(path("train-labels-idx1-ubyte"), idx_labels({9, 0, 10, 7, 1}), false);
  expect_error([&] { open_dataset(spec, image_opts()); }, {path("train-labels-idx1-ubyte"), "label 10"});
}

TEST_F(DataTest, TruncatedGzipIsAnError) {
  write_mnist_dir(dir_, true, true);
  const std::string f = path("train-images-idx3-ubyte.gz");
  // Bigger, incompressible-ish content so cutting the gzip stream loses pixel data.
  std::vector<uint8_t> img;
  put_be32(img, 2051);
  put_be32(img, 5);
  put_be32(img, 64);
  put_be32(img, 64);
  uint64_t s = 1;
  for (int i = 0; i < 5 * 64 * 64; ++i) img.push_back(uint8_t((s = s * 6364136223846793005ull + 1) >> 56));
  write_file(f, img, true);
  write_file(path("t10k-images-idx3-ubyte.gz"), idx_images(3, 64, 64), true);
  open_dataset("mnist:" + dir_.string(), image_opts());  // valid before truncation
  fs::resize_file(f, fs::file_size(f) / 2);
  expect_error([&] { open_dataset("mnist:" + dir_.string(), image_opts()); }, {f});
}

TEST(DataReal, FashionMnistFromDebianPackage) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/train-images-idx3-ubyte.gz")) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  DataSplit s = open_dataset("fashion-mnist", image_opts());
  ASSERT_TRUE(s.train && s.test);
  EXPECT_EQ(s.train->size(), 60000);
  EXPECT_EQ(s.test->size(), 10000);
  EXPECT_EQ(s.train->sample_shape(), (Shape{1, 28, 28}));
  EXPECT_EQ(s.train->num_classes(), 10);
  EXPECT_EQ(s.train->storage_bytes(), size_t(60000) * 785);
  std::vector<int> counts(10, 0);
  std::vector<float> x(784);
  float lo = 1e9f, hi = -1e9f;
  for (int64_t i = 0; i < s.train->size(); ++i) {
    int32_t y = -5;
    s.train->get(i, x.data(), &y);
    ASSERT_GE(y, 0);
    ASSERT_LE(y, 9);
    counts[size_t(y)]++;
    if (i == 0) {
      EXPECT_EQ(y, 9) << "the first Fashion-MNIST training label is 9 (ankle boot)";
    }
    if (i < 100)
      for (float v : x) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[size_t(c)], 6000) << "class " << c;
  EXPECT_EQ(lo, 0.0f);
  EXPECT_EQ(hi, 1.0f);
  int32_t y0 = -5;
  s.test->get(0, x.data(), &y0);
  EXPECT_EQ(y0, 9);  // first test label is also 9
}

// ------------------------------------------------------------------------- CIFAR-10

namespace {
uint8_t cifar_pixel(int rec, int c, int h, int w) { return uint8_t((rec * 13 + c * 101 + h * 5 + w) % 256); }
std::vector<uint8_t> cifar_records(int first, int n) {
  std::vector<uint8_t> v;
  for (int r = first; r < first + n; ++r) {
    v.push_back(uint8_t(r % 10));
    for (int c = 0; c < 3; ++c)
      for (int h = 0; h < 32; ++h)
        for (int w = 0; w < 32; ++w) v.push_back(cifar_pixel(r, c, h, w));
  }
  return v;
}
void write_cifar_dir(const fs::path& d) {
  fs::create_directories(d);
  for (int b = 1; b <= 5; ++b)
    write_file((d / str_cat("data_batch_", b, ".bin")).string(), cifar_records((b - 1) * 2, 2), false);
  write_file((d / "test_batch.bin").string(), cifar_records(100, 3), false);
}
}  // namespace

TEST_F(DataTest, Cifar10BinaryBatches) {
  write_cifar_dir(dir_);
  DataSplit s = open_dataset("cifar10:" + dir_.string(), image_opts());
  EXPECT_EQ(s.train->size(), 10);
  EXPECT_EQ(s.test->size(), 3);
  EXPECT_EQ(s.train->sample_shape(), (Shape{3, 32, 32}));
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> y;
    auto x = get_x(*s.train, i, &y);
    EXPECT_EQ(y[0], i % 10);
    for (int c = 0; c < 3; ++c)  // CHW: channel planes of 32x32
      EXPECT_EQ(x[size_t(c * 1024 + 7 * 32 + 9)], float(cifar_pixel(i, c, 7, 9)) / 255.0f);
  }
  std::vector<int32_t> y;
  auto x = get_x(*s.test, 2, &y);
  EXPECT_EQ(y[0], 102 % 10);
  EXPECT_EQ(x[1024 + 31], float(cifar_pixel(102, 1, 0, 31)) / 255.0f);

  // Per-channel normalization.
  DataOptions o = image_opts();
  parse_normalize("0.1,0.2,0.3,0.5,0.25,2", o);
  DataSplit n = open_dataset("cifar10:" + dir_.string(), o);
  auto xn = get_x(*n.train, 4);
  const float mean[] = {0.1f, 0.2f, 0.3f}, sd[] = {0.5f, 0.25f, 2.0f};
  for (int c = 0; c < 3; ++c)
    EXPECT_EQ(xn[size_t(c * 1024 + 40)], (float(cifar_pixel(4, c, 1, 8)) / 255.0f - mean[c]) / sd[c]);

  // The tarball's own sub-folder is found.
  write_cifar_dir(dir_ / "outer" / "cifar-10-batches-bin");
  EXPECT_EQ(open_dataset("cifar10:" + (dir_ / "outer").string(), image_opts()).train->size(), 10);
}

TEST_F(DataTest, Cifar10Errors) {
  write_cifar_dir(dir_);
  const std::string spec = "cifar10:" + dir_.string();
  auto rec = cifar_records(0, 2);
  rec.pop_back();
  write_file(path("data_batch_3.bin"), rec, false);
  expect_error([&] { open_dataset(spec, image_opts()); }, {path("data_batch_3.bin"), "3073"});
  rec = cifar_records(0, 2);
  rec[3073] = 42;  // label of record 1
  write_file(path("data_batch_3.bin"), rec, false);
  expect_error([&] { open_dataset(spec, image_opts()); }, {path("data_batch_3.bin"), "label 42"});
  write_file(path("data_batch_3.bin"), cifar_records(0, 2), false);
  fs::remove(path("test_batch.bin"));
  expect_error([&] { open_dataset(spec, image_opts()); }, {path("test_batch.bin"), "not found"});
  // Normalize with the wrong number of channels.
  write_cifar_dir(dir_);
  DataOptions o = image_opts();
  parse_normalize("0.1,0.2,0.5,0.5", o);
  expect_error([&] { open_dataset(spec, o); }, {"--normalize", "3 channels"});
}

// ------------------------------------------------------------------------- tokens

namespace {
std::vector<uint8_t> shard(const std::vector<uint16_t>& tokens, int32_t magic = 20240520, int32_t version = 1,
                           int64_t count = -1) {
  std::vector<int32_t> hdr(256, 0);
  hdr[0] = magic;
  hdr[1] = version;
  hdr[2] = int32_t(count < 0 ? int64_t(tokens.size()) : count);
  std::vector<uint8_t> v(1024 + tokens.size() * 2);
  std::memcpy(v.data(), hdr.data(), 1024);
  if (!tokens.empty()) std::memcpy(v.data() + 1024, tokens.data(), tokens.size() * 2);  // no null source
  return v;
}
}  // namespace

TEST_F(DataTest, TokenShards) {
  std::vector<uint16_t> tok(23);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = uint16_t((i * 7) % 50);
  write_file(path("train.bin"), shard(tok), false);
  std::vector<uint16_t> val(9);
  for (size_t i = 0; i < val.size(); ++i) val[i] = uint16_t(90 + i);
  write_file(path("val.bin"), shard(val), false);

  DataSplit s = open_dataset("tokens:" + path("train.bin"), token_opts(4, 100));
  EXPECT_EQ(s.test, nullptr) << "no VAL_FILE: no test split";
  EXPECT_EQ(s.train->size(), (23 - 1) / 4);
  EXPECT_EQ(s.train->sample_shape(), Shape{4});
  EXPECT_EQ(s.train->label_shape(), Shape{4});
  EXPECT_EQ(s.train->sample_dtype(), DType::i32);
  EXPECT_EQ(s.train->num_classes(), 100);
  EXPECT_TRUE(s.train->is_tokens());
  for (int64_t i = 0; i < s.train->size(); ++i) {
    int32_t x[4], y[4];
    s.train->get(i, x, y);
    for (int t = 0; t < 4; ++t) {
      EXPECT_EQ(x[t], tok[size_t(i * 4 + t)]);
      EXPECT_EQ(y[t], tok[size_t(i * 4 + t + 1)]);
    }
  }
  DataSplit sv = open_dataset("tokens:" + path("train.bin") + ":" + path("val.bin"), token_opts(4, 100));
  ASSERT_NE(sv.test, nullptr);
  EXPECT_EQ(sv.test->size(), 2);
  int32_t x[4], y[4];
  sv.test->get(1, x, y);
  EXPECT_EQ(x[0], 94);
  EXPECT_EQ(y[3], 98);
  // gzip-compressed shards read the same.
  write_file(path("train.bin.gz"), shard(tok), true);
  DataSplit sg = open_dataset("tokens:" + path("train.bin.gz"), token_opts(4, 100));
  sg.train->get(2, x, y);
  EXPECT_EQ(x[1], tok[9]);
}

TEST_F(DataTest, TokenShardErrors) {
  std::vector<uint16_t> tok(20, 3);
  tok[13] = 77;
  const auto opts = token_opts(4, 50);
  write_file(path("magic.bin"), shard(tok, 20240521), false);
  expect_error([&] { open_dataset("tokens:" + path("magic.bin"), opts); }, {path("magic.bin"), "20240520"});
  write_file(path("version.bin"), shard(tok, 20240520, 2), false);
  expect_error([&] { open_dataset("tokens:" + path("version.bin"), opts); }, {path("version.bin"), "version"});
  write_file(path("trunc.bin"), shard(tok, 20240520, 1, 25), false);
  expect_error([&] { open_dataset("tokens:" + path("trunc.bin"), opts); }, {path("trunc.bin"), "truncated"});
  write_file(path("short_header.bin"), std::vector<uint8_t>(100, 0), false);
  expect_error([&] { open_dataset("tokens:" + path("short_header.bin"), opts); },
               {path("short_header.bin"), "truncated"});
  write_file(path("trailing.bin"), shard(tok, 20240520, 1, 15), false);
  expect_error([&] { open_dataset("tokens:" + path("trailing.bin"), opts); }, {path("trailing.bin"), "15 tokens"});
  write_file(path("vocab.bin"), shard(tok), false);
  expect_error([&] { open_dataset("tokens:" + path("vocab.bin"), opts); },
               {path("vocab.bin"), "token 77", "vocabulary has 50"});
  EXPECT_EQ(open_dataset("tokens:" + path("vocab.bin"), token_opts(4, 78)).train->size(), 4);
  expect_error([&] { open_dataset("tokens:" + path("vocab.bin"), token_opts(32, 100)); },
               {path("vocab.bin"), "20 tokens", "33"});
  expect_error([&] { open_dataset("tokens:" + path("absent.bin"), opts); }, {path("absent.bin"), "not found"});
  // A bad VAL_FILE is reported too.
  write_file(path("good.bin"), shard(std::vector<uint16_t>(20, 1)), false);
  expect_error([&] { open_dataset("tokens:" + path("good.bin") + ":" + path("magic.bin"), opts); },
               {path("magic.bin"), "magic"});
  // Tokens for an image model, images for a token model.
  expect_error([&] { open_dataset("tokens:" + path("good.bin"), image_opts()); }, {"--data", "takes images"});
  expect_error([&] { open_dataset("mnist:" + dir_.string(), opts); }, {"--data", "takes token"});
}

// ------------------------------------------------------------------------- hostile files

namespace {

// A gzip file of `prefix` followed by `zero_mib` MiB of zero bytes (about 1 KiB of gzip per
// MiB), built without compressing them all: one MiB of zeros deflated after a full flush
// (which resets the compressor) is the same bytes every time, so it is repeated.
std::vector<uint8_t> gzip_bomb(const std::vector<uint8_t>& prefix, uint64_t zero_mib) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, -15, 9, Z_DEFAULT_STRATEGY), Z_OK);
  auto deflate_all = [&](const std::vector<uint8_t>& in, int flush) {
    std::vector<uint8_t> out(deflateBound(&z, uLong(in.size())) + 64);
    z.next_in = const_cast<Bytef*>(in.data());
    z.avail_in = uInt(in.size());
    z.next_out = out.data();
    z.avail_out = uInt(out.size());
    EXPECT_NE(deflate(&z, flush), Z_STREAM_ERROR);
    EXPECT_EQ(z.avail_in, 0u);
    // Not resize(): g++ 12 under -fsanitize=address warns that it might grow (-Wstringop-overflow).
    out.erase(out.end() - std::ptrdiff_t(z.avail_out), out.end());
    return out;
  };
  const std::vector<uint8_t> mib(1 << 20, 0);
  std::vector<uint8_t> gz = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};
  std::vector<uint8_t> head = deflate_all(prefix, Z_FULL_FLUSH);
  gz.insert(gz.end(), head.begin(), head.end());
  const std::vector<uint8_t> block = deflate_all(mib, Z_FULL_FLUSH);
  EXPECT_EQ(deflate_all(mib, Z_FULL_FLUSH), block);  // the same every time: repeatable
  uLong crc = crc32(0, prefix.data(), uInt(prefix.size()));
  const uLong crc_mib = crc32(0, mib.data(), uInt(mib.size()));
  for (uint64_t i = 0; i < zero_mib; ++i) {
    gz.insert(gz.end(), block.begin(), block.end());
    crc = crc32_combine(crc, crc_mib, z_off_t(mib.size()));
  }
  const std::vector<uint8_t> tail = deflate_all({}, Z_FINISH);
  gz.insert(gz.end(), tail.begin(), tail.end());
  deflateEnd(&z);
  const uint32_t isize = uint32_t(prefix.size() + (zero_mib << 20));
  for (uint32_t v : {uint32_t(crc), isize})
    for (int b = 0; b < 4; ++b) gz.push_back(uint8_t(v >> (8 * b)));
  return gz;
}

long max_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

// Opening `spec` fails with a message naming `file` and one of `reasons`, within 20 s and
// without the process's peak memory growing by more than 256 MiB.
void expect_refused_cheaply(const std::string& spec, const DataOptions& opt, const std::string& file,
                            std::initializer_list<std::string> reasons) {
  const long rss0 = max_rss_mib();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    open_dataset(spec, opt);
    ADD_FAILURE() << spec << ": expected a sat::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    bool any = false;
    for (const auto& r : reasons) any |= msg.find(r) != std::string::npos;
    EXPECT_TRUE(any) << "message: " << msg;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 20.0) << spec;
  EXPECT_LT(max_rss_mib() - rss0, 256) << spec << ": peak memory grew by " << max_rss_mib() - rss0 << " MiB";
}

}  // namespace

// A ~10 MB gzip that decompresses to 10 GiB of zeros behind an IDX header claiming 2^31
// images: refused before allocating, in one line, quickly. 28x28 images (1.6 TiB) are more
// than the free memory; 2^29 of 1x1 (512 MiB) fit the memory but the data is 17 times what
// is declared, though the gzip trailer's size (modulo 2^32) agrees with the header.
TEST_F(DataTest, GzipBombIsRefusedWithoutAllocating) {
  write_mnist_dir(dir_, false, false);
  const std::string f = path("train-images-idx3-ubyte.gz");
  fs::remove(path("train-images-idx3-ubyte"));
  std::vector<uint8_t> hdr;
  for (uint32_t v : {2051u, 1u << 31, 28u, 28u}) put_be32(hdr, v);
  std::vector<uint8_t> bomb = gzip_bomb(hdr, 10240);
  EXPECT_GT(bomb.size(), 9u << 20);
  EXPECT_LT(bomb.size(), 12u << 20);
  write_file(f, bomb, false);
  expect_refused_cheaply("mnist:" + dir_.string(), image_opts(), f, {"2147483648 images of 28x28", "free memory"});

  // 2^29 images of 1x1 (512 MiB) behind 8.5 GiB, whose size modulo 2^32 is the declared one.
  hdr.clear();
  for (uint32_t v : {2051u, 1u << 29, 1u, 1u}) put_be32(hdr, v);
  write_file(f, gzip_bomb(hdr, 8704), false);
  expect_refused_cheaply("mnist:" + dir_.string(), image_opts(), f, {"decompresses to more than", "free memory"});

  // A token shard declaring 1000 tokens, decompressing to 10 GiB.
  std::vector<uint8_t> shard_hdr = shard({}, 20240520, 1, 1000);
  const std::string t = path("bomb.bin.gz");
  write_file(t, gzip_bomb(shard_hdr, 10240), false);
  expect_refused_cheaply("tokens:" + t, token_opts(4, 100), t, {"decompresses to more than the 3024 bytes"});

  // CIFAR-10 has no header: its gzip data is counted (not kept) before anything is allocated.
  write_cifar_dir(dir_);
  const std::string c = path("data_batch_2.bin");
  write_file(c, gzip_bomb(std::vector<uint8_t>(5, 1), 64), false);  // 64 MiB + 5: not whole records
  expect_refused_cheaply("cifar10:" + dir_.string(), image_opts(), c, {"not a whole number of CIFAR-10 records"});
}

// A gzip file that decompresses to exactly what its header declares reads the same whether
// its trailer agrees (one member) or not (two members: the trailer holds the last one's size).
TEST_F(DataTest, MultiMemberGzipReadsAsOne) {
  write_mnist_dir(dir_, false, false);
  const auto img = idx_images(5, 3, 4);
  const std::vector<uint8_t> a(img.begin(), img.begin() + 20), b(img.begin() + 20, img.end());
  write_file(path("a.gz"), a, true);
  write_file(path("b.gz"), b, true);
  std::vector<uint8_t> both;
  for (const char* n : {"a.gz", "b.gz"}) {
    std::ifstream in(path(n), std::ios::binary);
    both.insert(both.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  fs::remove(path("train-images-idx3-ubyte"));
  write_file(path("train-images-idx3-ubyte.gz"), both, false);
  DataSplit s = open_dataset("mnist:" + dir_.string(), image_opts());
  EXPECT_EQ(s.train->size(), 5);
  EXPECT_FLOAT_EQ(get_x(*s.train, 4)[11], idx_pixel(4, 2, 3) / 255.0f);
  // Gzip data one byte short of, or one byte beyond, the header's count.
  const std::vector<uint8_t> short_img(img.begin(), img.end() - 1);
  write_file(path("train-images-idx3-ubyte.gz"), short_img, true);
  expect_error([&] { open_dataset("mnist:" + dir_.string(), image_opts()); },
               {path("train-images-idx3-ubyte.gz"), "truncated"});
  auto long_img = img;
  long_img.push_back(0);
  write_file(path("train-images-idx3-ubyte.gz"), long_img, true);
  expect_error([&] { open_dataset("mnist:" + dir_.string(), image_opts()); },
               {path("train-images-idx3-ubyte.gz"), "decompresses to more than the 76 bytes"});
}

// Regression: the IDX dimensions' product was taken in 64 bits, so 2 x 4294901761 x
// 2147516416 wrapped to 65536 and passed the size check (then the dataset's own shape
// overflowed int64: undefined behaviour).
TEST_F(DataTest, IdxDimensionProductDoesNotWrap) {
  write_mnist_dir(dir_, false, false);
  std::vector<uint8_t> img;
  for (uint32_t v : {2051u, 2u, 4294901761u, 2147516416u}) put_be32(img, v);
  img.resize(img.size() + 65536, 0);
  write_file(path("train-images-idx3-ubyte"), img, false);
  expect_error([&] { open_dataset("mnist:" + dir_.string(), image_opts()); },
               {path("train-images-idx3-ubyte"), "2 images of 4294901761x2147516416", "implausibly large"});
}

// ------------------------------------------------------------------------- specs, normalize

TEST(DataSpec, UnknownSpecListsTheAcceptedForms) {
  expect_error([] { open_dataset("imagenet", DataOptions{}); },
               {"--data imagenet", "fashion-mnist", "mnist:DIR", "cifar10:DIR", "tokens:FILE", "synthetic"});
  expect_error([] { open_dataset("mnist", DataOptions{}); }, {"--data mnist", "mnist:DIR"});
  expect_error([] { open_dataset("synthetic:3x32", DataOptions{}); }, {"--data synthetic:3x32", "CxHxW"});
  expect_error([] { open_dataset("synthetic:3x0x4", DataOptions{}); }, {"--data synthetic:3x0x4"});
  expect_error([] { open_dataset("tokens:", token_opts(4, 10)); }, {"--data tokens:", "tokens:FILE"});
}

TEST(DataSpec, NormalizeParsingAndValues) {
  DataOptions o;
  parse_normalize("0.2860,0.3530", o);
  ASSERT_EQ(o.mean.size(), 1u);
  EXPECT_FLOAT_EQ(o.mean[0], 0.2860f);
  EXPECT_FLOAT_EQ(o.std[0], 0.3530f);
  parse_normalize("1,2,3,4,5,6", o);
  EXPECT_EQ(o.mean, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(o.std, (std::vector<float>{4, 5, 6}));
  expect_error([] { DataOptions d; parse_normalize("0.5", d); }, {"--normalize 0.5"});
  expect_error([] { DataOptions d; parse_normalize("0.5,0.5,0.5", d); }, {"--normalize"});
  expect_error([] { DataOptions d; parse_normalize("0.5,abc", d); }, {"--normalize", "abc"});
  expect_error([] { DataOptions d; parse_normalize("0.5,0", d); }, {"--normalize", "std"});
  // Normalize with tokens is a mistake.
  DataOptions t = token_opts(4, 10);
  t.mean = {0.5f};
  t.std = {0.5f};
  expect_error([&] { open_dataset("synthetic", t); }, {"--normalize"});
}

TEST_F(DataTest, NormalizeAppliesToIdxPixels) {
  write_mnist_dir(dir_, false, true);
  DataOptions o;
  parse_normalize("0.5,0.25", o);
  DataSplit s = open_dataset("mnist:" + dir_.string(), o);
  auto x = get_x(*s.train, 3);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c)
      EXPECT_EQ(x[size_t(r * 4 + c)], (float(idx_pixel(3, r, c)) / 255.0f - 0.5f) / 0.25f);
  EXPECT_NE(s.description.find("0.5"), std::string::npos);
}

// ------------------------------------------------------------------------- synthetic

TEST(DataSynthetic, ImagesDeterministicPerSeedAndLearnable) {
  DataOptions a;
  a.seed = 7;
  DataSplit s1 = open_dataset("synthetic", a), s2 = open_dataset("synthetic", a);
  a.seed = 8;
  DataSplit s3 = open_dataset("synthetic", a);
  EXPECT_EQ(s1.train->size(), 10000);
  EXPECT_EQ(s1.test->size(), 2000);
  EXPECT_EQ(s1.train->sample_shape(), (Shape{1, 28, 28}));
  EXPECT_EQ(s1.train->num_classes(), 10);
  EXPECT_EQ(s1.train->storage_bytes(), 0u);
  int differ = 0;
  for (int64_t i : {0, 1, 999, 9999}) {
    std::vector<int32_t> y1, y2, y3;
    auto x1 = get_x(*s1.train, i, &y1), x2 = get_x(*s2.train, i, &y2), x3 = get_x(*s3.train, i, &y3);
    EXPECT_EQ(x1, x2);
    EXPECT_EQ(y1, y2);
    differ += x1 != x3;
    for (float v : x1) ASSERT_TRUE(v >= 0.0f && v <= 1.0f);
    ASSERT_TRUE(y1[0] >= 0 && y1[0] < 10);
  }
  EXPECT_EQ(differ, 4) << "another seed gives other data";
  EXPECT_NE(get_x(*s1.train, 0), get_x(*s1.test, 0)) << "train and test are different streams";

  // Learnable: nearest class mean (from 2000 train samples) classifies held-out test samples.
  const size_t D = 784;
  std::vector<double> mean(10 * D, 0.0);
  std::vector<int> count(10, 0);
  for (int64_t i = 0; i < 2000; ++i) {
    std::vector<int32_t> y;
    auto x = get_x(*s1.train, i, &y);
    count[size_t(y[0])]++;
    for (size_t j = 0; j < D; ++j) mean[size_t(y[0]) * D + j] += x[j];
  }
  for (int c = 0; c < 10; ++c) {
    ASSERT_GT(count[size_t(c)], 100) << "labels are spread over the classes";
    for (size_t j = 0; j < D; ++j) mean[size_t(c) * D + j] /= count[size_t(c)];
  }
  int correct = 0;
  for (int64_t i = 0; i < 500; ++i) {
    std::vector<int32_t> y;
    auto x = get_x(*s1.test, i, &y);
    int best = -1;
    double best_d = 1e30;
    for (int c = 0; c < 10; ++c) {
      double d = 0;
      for (size_t j = 0; j < D; ++j) d += (x[j] - mean[size_t(c) * D + j]) * (x[j] - mean[size_t(c) * D + j]);
      if (d < best_d) best_d = d, best = c;
    }
    correct += best == y[0];
  }
  EXPECT_GT(correct, 475) << "synthetic images must be learnable";

  DataSplit other = open_dataset("synthetic:3x17x9", DataOptions{});
  EXPECT_EQ(other.train->sample_shape(), (Shape{3, 17, 9}));
  auto x = get_x(*other.train, 5);
  EXPECT_EQ(x.size(), 3u * 17 * 9);
  // Same options but resnet-like default shape.
  DataOptions r;
  r.image_shape = Shape{3, 32, 32};
  EXPECT_EQ(open_dataset("synthetic", r).train->sample_shape(), (Shape{3, 32, 32}));
}

TEST(DataSynthetic, TokensDeterministicShiftedAndLearnable) {
  DataOptions o = token_opts(16, 50257);
  o.seed = 3;
  DataSplit s1 = open_dataset("synthetic", o), s2 = open_dataset("synthetic", o);
  o.seed = 4;
  DataSplit s3 = open_dataset("synthetic", o);
  EXPECT_EQ(s1.train->size(), 2000);
  EXPECT_EQ(s1.test->size(), 200);
  EXPECT_EQ(s1.train->sample_shape(), Shape{16});
  EXPECT_EQ(s1.train->label_shape(), Shape{16});
  EXPECT_EQ(s1.train->num_classes(), 50257);
  std::map<int32_t, std::set<int32_t>> successors;
  int differ = 0;
  for (int64_t i = 0; i < 2000; ++i) {
    int32_t x1[16], y1[16], x2[16], y2[16], x3[16], y3[16];
    s1.train->get(i, x1, y1);
    s2.train->get(i, x2, y2);
    s3.train->get(i, x3, y3);
    ASSERT_EQ(0, std::memcmp(x1, x2, sizeof x1));
    ASSERT_EQ(0, std::memcmp(y1, y2, sizeof y1));
    differ += std::memcmp(x1, x3, sizeof x1) != 0;
    for (int t = 0; t < 16; ++t) {
      ASSERT_TRUE(x1[t] >= 0 && x1[t] < 50257);
      ASSERT_TRUE(y1[t] >= 0 && y1[t] < 50257);
      if (t + 1 < 16) {
        ASSERT_EQ(y1[t], x1[t + 1]) << "labels are the next tokens";
      }
      successors[x1[t]].insert(y1[t]);
    }
  }
  EXPECT_GT(differ, 1990);
  // A sparse Markov chain: each token is followed by at most 4 others (learnable),
  // while many distinct tokens occur.
  EXPECT_GT(successors.size(), 300u);
  for (auto& [tok, next] : successors) ASSERT_LE(next.size(), 4u) << "token " << tok;
  // Small vocabularies work too.
  DataSplit small = open_dataset("synthetic", token_opts(8, 5));
  int32_t x[8], y[8];
  small.test->get(7, x, y);
  for (int t = 0; t < 8; ++t) EXPECT_TRUE(x[t] < 5 && y[t] < 5);
  expect_error([] { open_dataset("synthetic:1x28x28", token_opts(8, 5)); }, {"--data synthetic:1x28x28", "tokens"});
}

// ------------------------------------------------------------------------- memory datasets

TEST(DataMemory, TensorDatasets) {
  auto ds = make_tensor_dataset(Shape{2, 2}, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}, {0, 2}, Shape{}, 3);
  EXPECT_EQ(ds->size(), 2);
  std::vector<int32_t> y;
  EXPECT_EQ(get_x(*ds, 1, &y), (std::vector<float>{5, 6, 7, 8}));
  EXPECT_EQ(y[0], 2);
  auto tk = make_tensor_dataset(Shape{3}, std::vector<int32_t>{1, 2, 3, 4, 5, 6}, {2, 3, 4, 5, 6, -1}, Shape{3}, 7);
  EXPECT_EQ(tk->sample_dtype(), DType::i32);
  int32_t x[3], yy[3];
  tk->get(1, x, yy);
  EXPECT_EQ(x[2], 6);
  EXPECT_EQ(yy[2], -1);
  expect_error([] { make_tensor_dataset(Shape{2}, std::vector<float>{1, 2, 3}, {0, 1}, Shape{}, 2); }, {"sample"});
  expect_error([] { make_tensor_dataset(Shape{1}, std::vector<float>{1, 2}, {0, 5}, Shape{}, 2); }, {"label 5"});
  expect_error([] { make_tensor_dataset(Shape{1}, std::vector<int32_t>{1, 9}, {0, 1}, Shape{}, 2); }, {"token 9"});
}

// ------------------------------------------------------------------------- loader

namespace {
// Sample i = {i, i + 0.5}, label i % 7.
std::unique_ptr<Dataset> index_dataset(int64_t n) {
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int64_t i = 0; i < n; ++i) {
    x.push_back(float(i));
    x.push_back(float(i) + 0.5f);
    y.push_back(int32_t(i % 7));
  }
  return make_tensor_dataset(Shape{2}, std::move(x), std::move(y), Shape{}, 7, "index");
}

// Sample indices of one epoch, in batch order (from x[row][0]); padded rows skipped.
std::vector<int64_t> epoch_indices(BatchLoader& L, int64_t epoch) {
  L.start_epoch(epoch);
  std::vector<int64_t> out;
  Batch b;
  while (L.next(b)) {
    for (int64_t r = 0; r < b.valid; ++r) out.push_back(int64_t(b.x.f32()[r * 2]));
  }
  return out;
}

// A dataset whose get() throws at one index (to test error propagation from the worker).
class ThrowingDataset : public Dataset {
 public:
  int64_t size() const override { return 20; }
  Shape sample_shape() const override { return Shape{1}; }
  DType sample_dtype() const override { return DType::f32; }
  Shape label_shape() const override { return Shape{}; }
  int64_t num_classes() const override { return 2; }
  std::string name() const override { return "throwing"; }
  void get(int64_t i, void* x, int32_t* y) const override {
    if (i == 13) fail("throwing dataset: sample 13 is unreadable");
    *static_cast<float*>(x) = float(i);
    *y = 0;
  }
};
}  // namespace

TEST(DataLoader, ShuffleOffIsFileOrder) {
  auto ds = index_dataset(10);
  BatchLoader L(*ds, 4, /*shuffle=*/false, 1, /*drop_last=*/false);
  std::vector<int64_t> expect(10);
  std::iota(expect.begin(), expect.end(), 0);
  EXPECT_EQ(epoch_indices(L, 0), expect);
  EXPECT_EQ(epoch_indices(L, 1), expect);
}

TEST(DataLoader, ShuffleIsSeededPermutationPerEpoch) {
  auto ds = index_dataset(1000);
  BatchLoader A(*ds, 32, true, 42, false), B(*ds, 32, true, 42, false), C(*ds, 32, true, 43, false);
  auto a0 = epoch_indices(A, 0), a1 = epoch_indices(A, 1);
  auto b0 = epoch_indices(B, 0), b1 = epoch_indices(B, 1), c0 = epoch_indices(C, 0);
  auto sorted = a0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota) << "an epoch visits every sample once";
  EXPECT_NE(a0, iota);
  EXPECT_NE(a0, a1) << "each epoch has its own order";
  EXPECT_EQ(a0, b0) << "same seed, same order";
  EXPECT_EQ(a1, b1);
  EXPECT_NE(a0, c0) << "another seed, another order";
  EXPECT_EQ(a1, BatchLoader::epoch_order(1000, true, 42, 1));
  // The documented Fisher-Yates from Rng(mix_seed(seed, epoch)).
  std::vector<int64_t> p = iota;
  Rng rng(mix_seed(42, 0));
  for (int64_t i = 999; i >= 1; --i) std::swap(p[size_t(i)], p[size_t(rng.below(uint64_t(i + 1)))]);
  EXPECT_EQ(a0, p);
  // Restarting an epoch replays it.
  EXPECT_EQ(epoch_indices(A, 0), a0);
}

TEST(DataLoader, DropLastVersusPaddedFinalBatch) {
  auto ds = index_dataset(10);
  BatchLoader drop(*ds, 4, false, 0, true);
  EXPECT_EQ(drop.batches_per_epoch(), 2);
  EXPECT_EQ(epoch_indices(drop, 0), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));

  BatchLoader pad(*ds, 4, false, 0, false);
  EXPECT_EQ(pad.batches_per_epoch(), 3);
  pad.start_epoch(5);
  Batch b;
  std::vector<int64_t> valid;
  while (pad.next(b)) {
    EXPECT_EQ(b.x.shape, (Shape{4, 2}));
    EXPECT_EQ(b.y.shape, Shape{4});
    EXPECT_EQ(b.y.dtype, DType::i32);
    EXPECT_EQ(b.epoch, 5);
    EXPECT_EQ(b.index, int64_t(valid.size()));
    valid.push_back(b.valid);
    for (int64_t r = 0; r < 4; ++r) {
      const int64_t k = b.index * 4 + r;
      if (r < b.valid) {
        EXPECT_EQ(b.x.f32()[r * 2 + 1], float(k) + 0.5f);
        EXPECT_EQ(b.y.i32()[r], int32_t(k % 7));
      } else {
        EXPECT_EQ(b.x.f32()[r * 2], 0.0f);
        EXPECT_EQ(b.x.f32()[r * 2 + 1], 0.0f);
        EXPECT_EQ(b.y.i32()[r], -1) << "padded rows are ignored by the loss";
      }
    }
  }
  EXPECT_EQ(valid, (std::vector<int64_t>{4, 4, 2}));
  EXPECT_FALSE(pad.next(b)) << "stays at the end until the next start_epoch";

  // Token labels are padded with -1 in every position.
  auto tk = make_tensor_dataset(Shape{3}, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}, {2, 3, 4, 5, 6, 7, 8, 9, 0},
                                Shape{3}, 10);
  BatchLoader tl(*tk, 2, false, 0, false);
  Batch tb;
  ASSERT_TRUE(tl.next(tb));  // next() without start_epoch begins epoch 0
  EXPECT_EQ(tb.x.shape, (Shape{2, 3}));
  EXPECT_EQ(tb.x.dtype, DType::i32);
  EXPECT_EQ(tb.epoch, 0);
  ASSERT_TRUE(tl.next(tb));
  EXPECT_EQ(tb.valid, 1);
  EXPECT_EQ(tb.x.i32()[0], 7);
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(tb.y.i32()[3 + t], -1);
    EXPECT_EQ(tb.x.i32()[3 + t], 0);
  }
  EXPECT_FALSE(tl.next(tb));

  expect_error([&] { BatchLoader too_big(*ds, 11, false, 0, true); }, {"batch size 11", "index", "10 samples"});
  BatchLoader eval_big(*ds, 11, false, 0, false);  // padded: one batch of 11 with 10 valid
  EXPECT_EQ(eval_big.batches_per_epoch(), 1);
}

TEST(DataLoader, PrefetchThreadMatchesSynchronousRead) {
  DataOptions o;
  o.seed = 11;
  DataSplit s = open_dataset("synthetic", o);
  const Dataset& ds = *s.test;  // 2000 images
  const int64_t B = 64;
  const size_t row = ds.sample_bytes();
  for (int prefetch : {0, 1, 2, 4}) {
    BatchLoader L(ds, B, true, 5, false, prefetch);
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      L.start_epoch(epoch);
      auto order = BatchLoader::epoch_order(ds.size(), true, 5, epoch);
      Batch b;
      int64_t n = 0;
      std::vector<float> x(size_t(ds.sample_shape().numel()));
      while (L.next(b)) {
        if (b.index % 5 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let it run ahead
        for (int64_t r = 0; r < b.valid; ++r) {
          int32_t y = -2;
          ds.get(order[size_t(n + r)], x.data(), &y);
          ASSERT_EQ(0, std::memcmp(x.data(), b.x.u8() + size_t(r) * row, row))
              << "prefetch " << prefetch << " epoch " << epoch << " batch " << b.index << " row " << r;
          ASSERT_EQ(b.y.i32()[r], y);
        }
        n += b.valid;
      }
      EXPECT_EQ(n, ds.size());
    }
  }
}

TEST(DataLoader, HandedOutBatchIsNotOverwrittenWhilePrefetching) {
  auto ds = index_dataset(200);
  BatchLoader L(*ds, 8, false, 0, true, 2);
  L.start_epoch(0);
  Batch b;
  for (int k = 0; k < 25; ++k) {
    ASSERT_TRUE(L.next(b));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the worker fills the other slot meanwhile
    for (int64_t r = 0; r < 8; ++r) ASSERT_EQ(b.x.f32()[r * 2], float(k * 8 + r));
  }
  EXPECT_FALSE(L.next(b));
}

TEST(DataLoader, BuffersAreCountedAndPredicted) {
  DataOptions o;
  o.image_shape = Shape{3, 32, 32};
  DataSplit s = open_dataset("synthetic", o);
  for (int prefetch : {0, 1, 3}) {
    const size_t before = mem_stats().current;
    {
      BatchLoader L(*s.train, 50, true, 0, true, prefetch);
      EXPECT_EQ(mem_stats().current - before, BatchLoader::buffer_bytes(*s.train, 50, prefetch));
      EXPECT_EQ(BatchLoader::buffer_bytes(*s.train, 50, prefetch),
                size_t(std::max(prefetch, 1)) * 50 * (3 * 32 * 32 * 4 + 4));
    }
    EXPECT_EQ(mem_stats().current, before);
  }
}

TEST(DataLoader, WorkerErrorIsRethrownAndShutdownIsClean) {
  ThrowingDataset ds;
  for (int prefetch : {0, 2}) {
    BatchLoader L(ds, 4, false, 0, true, prefetch);
    L.start_epoch(0);
    Batch b;
    int got = 0;
    try {
      while (L.next(b)) ++got;
      ADD_FAILURE() << "expected the dataset's error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sample 13"), std::string::npos);
    }
    EXPECT_EQ(got, 3) << "batches before the bad one are delivered";
  }
  // Destroying a loader mid-epoch, or before any epoch, does not hang.
  auto big = index_dataset(10000);
  for (int k = 0; k < 20; ++k) {
    BatchLoader L(*big, 16, true, uint64_t(k), true, 3);
    Batch b;
    if (k % 2) {
      L.start_epoch(0);
      ASSERT_TRUE(L.next(b));
      L.start_epoch(1);  // restart mid-epoch
      ASSERT_TRUE(L.next(b));
      EXPECT_EQ(b.epoch, 1);
      EXPECT_EQ(b.index, 0);
    }
  }
}

// ------------------------------------------------------------------------- data-parallel sharding

namespace {
// Sample i = {i}, label i: a batch's labels are the permutation's sample indices.
std::unique_ptr<Dataset> label_index_dataset(int64_t n) {
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int64_t i = 0; i < n; ++i) {
    x.push_back(float(i));
    y.push_back(int32_t(i));
  }
  return make_tensor_dataset(Shape{1}, std::move(x), std::move(y), Shape{}, n, "indexed");
}

// The labels of one batch, checking that x agrees with them (x = {label}, or 0 when padded).
std::vector<int32_t> batch_labels(const Batch& b) {
  std::vector<int32_t> y(b.y.i32(), b.y.i32() + b.y.numel());
  for (int64_t r = 0; r < b.y.numel(); ++r) EXPECT_EQ(b.x.f32()[r], y[size_t(r)] < 0 ? 0.0f : float(y[size_t(r)]));
  return y;
}

// All batches of one epoch, each as its labels.
std::vector<std::vector<int32_t>> epoch_batches(BatchLoader& L, int64_t epoch) {
  L.start_epoch(epoch);
  std::vector<std::vector<int32_t>> out;
  Batch b;
  while (L.next(b)) {
    EXPECT_EQ(b.epoch, epoch);
    EXPECT_EQ(b.index, int64_t(out.size()));
    EXPECT_EQ(b.y.shape, Shape{L.batch_size()});
    out.push_back(batch_labels(b));
    int64_t real = 0;
    for (int32_t v : out.back()) real += v >= 0;
    EXPECT_EQ(b.valid, real);
    for (int64_t r = 0; r < b.valid; ++r) EXPECT_GE(out.back()[size_t(r)], 0) << "real rows come first";
  }
  return out;
}
}  // namespace

TEST(DataShard, WorldOneIsTodaysLoader) {
  // Sharding{} and an explicit rank 0 of world 1 give the loader's usual batches.
  auto ds = label_index_dataset(23);
  for (bool train : {true, false}) {
    BatchLoader plain(*ds, 4, true, 9, train, 2);
    BatchLoader sharded(*ds, 4, true, 9, train, 0, Sharding{0, 1, 1, LastBatch::drop});
    auto a = epoch_batches(plain, 3), b = epoch_batches(sharded, 3);
    EXPECT_EQ(a, b);
    auto order = BatchLoader::epoch_order(23, true, 9, 3);
    ASSERT_EQ(a.size(), train ? 5u : 6u);
    for (size_t k = 0; k < a.size(); ++k)
      for (size_t r = 0; r < 4; ++r) {
        const size_t q = k * 4 + r;
        EXPECT_EQ(a[k][r], q < 23 ? int32_t(order[q]) : -1);
      }
  }
}

TEST(DataShard, RanksTogetherAreOneGlobalBatch) {
  for (int64_t n : {1, 7, 50, 97}) {
    auto ds = label_index_dataset(n);
    for (LastBatch last : {LastBatch::drop, LastBatch::pad}) {
      for (int world : {1, 2, 3, 4}) {
        for (int64_t K : {1, 2, 3}) {
          for (int64_t b : {1, 3, 4}) {
            const int64_t G = int64_t(world) * K * b;
            if (last == LastBatch::drop && G > n) continue;  // an error, tested below
            const std::string what = str_cat("n ", n, " world ", world, " K ", K, " b ", b,
                                             last == LastBatch::pad ? " pad" : " drop");
            const int64_t steps = last == LastBatch::pad ? (n + G - 1) / G : n / G;
            ASSERT_EQ(BatchLoader::train_steps(n, b, K, world, last), steps) << what;
            BatchLoader one(*ds, G, true, 17, true, 1, Sharding{0, 1, 1, last});
            ASSERT_EQ(one.batches_per_epoch(), steps) << what;
            for (int64_t epoch : {0, 1}) {
              const auto order = BatchLoader::epoch_order(n, true, 17, epoch);
              const auto global = epoch_batches(one, epoch);
              ASSERT_EQ(int64_t(global.size()), steps) << what;
              std::vector<std::vector<std::vector<int32_t>>> ranks;  // [rank][micro-batch] labels
              for (int r = 0; r < world; ++r) {
                BatchLoader L(*ds, b, true, 17, true, r % 2 ? 0 : 2, Sharding{r, world, K, last});
                EXPECT_EQ(L.batches_per_epoch(), steps * K) << what;
                EXPECT_EQ(L.steps_per_epoch(), steps) << what;
                EXPECT_EQ(L.global_batch(), G) << what;
                ranks.push_back(epoch_batches(L, epoch));
                ASSERT_EQ(int64_t(ranks.back().size()), steps * K) << what << " rank " << r;
              }
              std::vector<int64_t> uses(size_t(n), 0);
              for (int64_t k = 0; k < steps; ++k) {
                // Rank-major concatenation of the step's micro-batches = the global batch.
                std::vector<int32_t> cat;
                for (int r = 0; r < world; ++r)
                  for (int64_t m = 0; m < K; ++m) {
                    const auto& mb = ranks[size_t(r)][size_t(k * K + m)];
                    ASSERT_EQ(int64_t(mb.size()), b);
                    for (int64_t j = 0; j < b; ++j) {
                      // The documented slice: positions k*G + (r*K + m)*b + j (mod n under pad).
                      const int64_t q = k * G + (r * K + m) * b + j;
                      ASSERT_EQ(mb[size_t(j)], int32_t(order[size_t(q % n)])) << what << " step " << k;
                    }
                    cat.insert(cat.end(), mb.begin(), mb.end());
                  }
                ASSERT_EQ(cat, global[size_t(k)]) << what << " step " << k;
                for (int32_t v : cat) {
                  ASSERT_GE(v, 0) << "training batches hold real samples only";
                  uses[size_t(v)]++;
                }
              }
              // Sample use: drop leaves out exactly the last n mod G positions; pad repeats
              // exactly the first steps*G - n positions (wrapping around when G > n).
              std::vector<int64_t> expect(size_t(n), 0);
              for (int64_t q = 0; q < steps * G; ++q) expect[size_t(order[size_t(q % n)])]++;
              EXPECT_EQ(uses, expect) << what;
              if (last == LastBatch::drop) {
                for (int64_t q = 0; q < n; ++q)
                  ASSERT_EQ(uses[size_t(order[size_t(q)])], q < n - n % G ? 1 : 0) << what;
              } else if (steps * G - n <= n) {
                for (int64_t q = 0; q < n; ++q)
                  ASSERT_EQ(uses[size_t(order[size_t(q)])], q < steps * G - n ? 2 : 1) << what;
              }
            }
          }
        }
      }
    }
  }
}

TEST(DataShard, AccumulationKeepsTheSingleProcessMicroBatchOrder) {
  // World 1 with K micro-batches per step: micro-batch k*K + m is today's batch k*K + m
  // of a loader with batch b; only the epoch's end moves to a multiple of K*b.
  auto ds = label_index_dataset(103);
  for (int64_t K : {2, 3, 5}) {
    BatchLoader today(*ds, 4, true, 5, true, 2);
    BatchLoader accum(*ds, 4, true, 5, true, 2, Sharding{0, 1, K, LastBatch::drop});
    auto a = epoch_batches(today, 2), b = epoch_batches(accum, 2);
    EXPECT_EQ(int64_t(b.size()), 103 / (K * 4) * K);
    ASSERT_LE(b.size(), a.size());
    for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(a[i], b[i]) << "K " << K << " micro-batch " << i;
  }
}

TEST(DataShard, PaddedEpochCompletesEveryRank) {
  // 10 samples, G = 2 ranks x 2 x 3 = 12: under pad one step, positions 10 and 11 are
  // the permutation's first two samples again; rank 1's second micro-batch ends with them.
  auto ds = label_index_dataset(10);
  const auto order = BatchLoader::epoch_order(10, true, 3, 0);
  BatchLoader r1(*ds, 3, true, 3, true, 2, Sharding{1, 2, 2, LastBatch::pad});
  auto got = epoch_batches(r1, 0);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], (std::vector<int32_t>{int32_t(order[6]), int32_t(order[7]), int32_t(order[8])}));
  EXPECT_EQ(got[1], (std::vector<int32_t>{int32_t(order[9]), int32_t(order[0]), int32_t(order[1])}));
  // G larger than twice the data: positions wrap around more than once, still full batches.
  BatchLoader big(*ds, 8, true, 3, true, 0, Sharding{2, 3, 1, LastBatch::pad});
  got = epoch_batches(big, 0);
  ASSERT_EQ(got.size(), 1u);
  for (int64_t j = 0; j < 8; ++j) EXPECT_EQ(got[0][size_t(j)], int32_t(order[size_t((16 + j) % 10)]));
}

TEST(DataShard, GlobalBatchLargerThanTheDataIsAnErrorUnderDrop) {
  auto ds = label_index_dataset(10);
  expect_error([&] { BatchLoader L(*ds, 2, true, 0, true, 2, Sharding{1, 3, 2, LastBatch::drop}); },
               {"--batch x --accum x ranks = 2 x 2 x 3 = 12", "10 samples", "indexed"});
  expect_error([&] { BatchLoader L(*ds, 11, true, 0, true, 2); }, {"= 11", "10 samples", "indexed"});
  EXPECT_EQ(BatchLoader::train_steps(10, 2, 2, 3, LastBatch::drop), 0);
  BatchLoader exact(*ds, 5, true, 0, true, 2, Sharding{1, 2, 1, LastBatch::drop});  // G == n is fine
  EXPECT_EQ(exact.batches_per_epoch(), 1);
  // Evaluation never refuses: it pads.
  BatchLoader eval(*ds, 4, false, 0, false, 2, Sharding{3, 4, 7, LastBatch::drop});
  EXPECT_EQ(eval.batches_per_epoch(), 1);
  // Bad sharding arguments.
  expect_error([&] { BatchLoader L(*ds, 2, true, 0, true, 2, Sharding{2, 2, 1, LastBatch::drop}); },
               {"rank 2", "< 2"});
  expect_error([&] { BatchLoader L(*ds, 2, true, 0, true, 2, Sharding{-1, 2, 1, LastBatch::drop}); }, {"rank -1"});
  expect_error([&] { BatchLoader L(*ds, 2, true, 0, true, 2, Sharding{0, 0, 1, LastBatch::drop}); }, {"world size 0"});
  expect_error([&] { BatchLoader L(*ds, 2, true, 0, true, 2, Sharding{0, 1, 0, LastBatch::drop}); }, {"--accum 0"});
}

TEST(DataShard, EvaluationCoversEverySampleOnceWithEqualBatchCounts) {
  for (int64_t n : {1, 2, 3, 7, 10, 23, 64}) {
    auto ds = label_index_dataset(n);
    for (int world : {1, 2, 3, 4}) {
      for (int64_t b : {1, 3, 4, 8}) {
        const std::string what = str_cat("n ", n, " world ", world, " b ", b);
        const int64_t E = BatchLoader::eval_batches(n, b, world);
        const int64_t largest = (n + world - 1) / world;
        EXPECT_EQ(E, std::max<int64_t>(1, (largest + b - 1) / b)) << what;
        std::vector<int32_t> seen;
        for (int r = 0; r < world; ++r) {
          BatchLoader L(*ds, b, false, 0, false, r % 2 ? 2 : 0, Sharding{r, world, 3, LastBatch::pad});
          EXPECT_EQ(L.batches_per_epoch(), E) << what;
          for (int64_t epoch : {0, 1}) {
            auto batches = epoch_batches(L, epoch);
            ASSERT_EQ(int64_t(batches.size()), E) << what << " rank " << r;
            std::vector<int32_t> mine;
            for (auto& y : batches)
              for (int32_t v : y)
                if (v >= 0) mine.push_back(v);
            // A contiguous shard in file order; the first n mod world ranks get one more.
            const int64_t size = n / world + (r < n % world ? 1 : 0);
            ASSERT_EQ(int64_t(mine.size()), size) << what << " rank " << r;
            for (size_t i = 1; i < mine.size(); ++i) ASSERT_EQ(mine[i], mine[i - 1] + 1) << what;
            if (epoch == 0) seen.insert(seen.end(), mine.begin(), mine.end());
          }
        }
        std::vector<int32_t> all(static_cast<size_t>(n));
        std::iota(all.begin(), all.end(), 0);
        EXPECT_EQ(seen, all) << what << ": rank-major shards are the test set once, in order";
      }
    }
  }
  // Shuffled evaluation shards the epoch's permutation the same way.
  auto ds = label_index_dataset(11);
  const auto order = BatchLoader::epoch_order(11, true, 4, 2);
  std::vector<int32_t> seen;
  for (int r = 0; r < 3; ++r) {
    BatchLoader L(*ds, 2, true, 4, false, 2, Sharding{r, 3, 1, LastBatch::drop});
    for (auto& y : epoch_batches(L, 2))
      for (int32_t v : y)
        if (v >= 0) seen.push_back(v);
  }
  ASSERT_EQ(seen.size(), order.size());
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], int32_t(order[i]));
}

TEST(DataShard, BuffersDoNotDependOnSharding) {
  auto ds = label_index_dataset(100);
  const size_t before = mem_stats().current;
  {
    BatchLoader L(*ds, 5, true, 0, true, 3, Sharding{3, 4, 2, LastBatch::pad});
    EXPECT_EQ(mem_stats().current - before, BatchLoader::buffer_bytes(*ds, 5, 3));
  }
  EXPECT_EQ(mem_stats().current, before);
}

// Planning (saturate info, saturate plan) reads synthetic data's shapes only: the same
// sizes, shapes and classes as the data `synthetic` opens, and nothing to generate.
TEST(Data, SyntheticShapesAreTheDatasShapesWithoutTheData) {
  for (bool tokens : {false, true}) {
    sat::DataOptions opt;
    opt.model_takes_tokens = tokens;
    opt.image_shape = sat::Shape{3, 32, 32};
    opt.seq_len = 16;
    opt.vocab = 512;
    const sat::DataSplit real = sat::open_dataset("synthetic", opt);
    const sat::DataSplit shapes = sat::synthetic_shapes(opt);
    for (auto [a, b] : {std::pair{real.train.get(), shapes.train.get()}, {real.test.get(), shapes.test.get()}}) {
      EXPECT_EQ(a->size(), b->size());
      EXPECT_EQ(a->sample_shape(), b->sample_shape());
      EXPECT_EQ(a->sample_dtype(), b->sample_dtype());
      EXPECT_EQ(a->label_shape(), b->label_shape());
      EXPECT_EQ(a->num_classes(), b->num_classes());
    }
    std::vector<float> x(3 * 32 * 32);
    std::vector<int32_t> y(16);
    EXPECT_THROW(shapes.train->get(0, x.data(), y.data()), sat::Error);
  }
}

// ------------------------------------------------------------------------- loader workers

namespace {
// One epoch's batches as bytes (x then y), each checked while the loader's `keep` batches
// handed out last are still held: their bytes must not change while later batches are read.
std::vector<std::vector<uint8_t>> epoch_bytes(BatchLoader& L, int64_t epoch, int keep, int64_t first = 0) {
  L.start_epoch(epoch, first);
  std::vector<std::vector<uint8_t>> out;
  std::vector<Batch> held;
  Batch b;
  while (L.next(b)) {
    std::vector<uint8_t> bytes(b.x.u8(), b.x.u8() + b.x.bytes());
    bytes.insert(bytes.end(), reinterpret_cast<const uint8_t*>(b.y.i32()),
                 reinterpret_cast<const uint8_t*>(b.y.i32()) + b.y.bytes());
    bytes.push_back(uint8_t(b.valid));
    EXPECT_EQ(b.index, first + int64_t(out.size()));
    out.push_back(std::move(bytes));
    held.push_back(b);
    if (int(held.size()) > keep) held.erase(held.begin());
    for (const Batch& h : held) {  // every batch still held is as it was handed out
      const std::vector<uint8_t>& want = out[size_t(h.index - first)];
      EXPECT_EQ(0, std::memcmp(h.x.u8(), want.data(), h.x.bytes())) << "batch " << h.index << " changed";
    }
  }
  return out;
}

// Sample i = {i}, label 0, read slowly; counts the readers inside get() at once. With
// `meet` > 0 every reader waits (up to 20 s) until `meet` readers have been inside at once.
class SlowDataset : public Dataset {
 public:
  SlowDataset(int64_t n, int sleep_us, int meet = 0) : n_(n), sleep_us_(sleep_us), meet_(meet) {}
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return Shape{1}; }
  DType sample_dtype() const override { return DType::f32; }
  Shape label_shape() const override { return Shape{}; }
  int64_t num_classes() const override { return 2; }
  std::string name() const override { return "slow"; }
  size_t worker_scratch_bytes() const override { return 1000; }
  void get(int64_t i, void* x, int32_t* y) const override {
    {
      std::unique_lock<std::mutex> lk(mu_);
      most_ = std::max(most_, ++inside_);
      cv_.notify_all();
      if (meet_ > 0) cv_.wait_for(lk, std::chrono::seconds(20), [&] { return most_ >= meet_; });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    *static_cast<float*>(x) = float(i);
    *y = 0;
    std::lock_guard<std::mutex> lk(mu_);
    --inside_;
    ++reads_;
  }
  int most() const { std::lock_guard<std::mutex> lk(mu_); return most_; }
  int inside() const { std::lock_guard<std::mutex> lk(mu_); return inside_; }
  int64_t reads() const { std::lock_guard<std::mutex> lk(mu_); return reads_; }

 private:
  int64_t n_;
  int sleep_us_, meet_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable int inside_ = 0, most_ = 0;
  mutable int64_t reads_ = 0;
};

// Fails at the given samples: `slow` sleeps 30 ms before it throws, the others throw at once.
class FailingDataset : public Dataset {
 public:
  FailingDataset(std::set<int64_t> bad, int64_t slow) : bad_(std::move(bad)), slow_(slow) {}
  int64_t size() const override { return 40; }
  Shape sample_shape() const override { return Shape{1}; }
  DType sample_dtype() const override { return DType::f32; }
  Shape label_shape() const override { return Shape{}; }
  int64_t num_classes() const override { return 2; }
  std::string name() const override { return "failing"; }
  void get(int64_t i, void* x, int32_t* y) const override {
    if (i == slow_) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    if (bad_.count(i)) fail("failing dataset: sample ", i, " is unreadable");
    *static_cast<float*>(x) = float(i);
    *y = 0;
  }

 private:
  std::set<int64_t> bad_;
  int64_t slow_;
};
}  // namespace

TEST(DataLoaderWorkers, BatchesAreTheSameBytesWhateverTheWorkers) {
  DataOptions o;
  o.seed = 3;
  o.image_shape = Shape{3, 8, 8};
  DataSplit s = open_dataset("synthetic", o);
  const Dataset& ds = *s.test;  // 2000 images
  struct Case {
    const char* what;
    bool train;
    Sharding shard;
    int keep;
    int64_t batch;
  };
  const Case cases[] = {
      {"shuffled training", true, {}, 1, 48},
      {"sharded, accumulated, padded epoch", true, {1, 3, 2, LastBatch::pad}, 1, 37},
      {"padded evaluation shard", false, {2, 3, 1, LastBatch::drop}, 1, 50},
      {"keep 3 (a pipeline stage)", true, {0, 2, 4, LastBatch::drop}, 3, 16},
  };
  for (const Case& c : cases) {
    BatchLoader ref(ds, c.batch, true, 7, c.train, c.shard, LoaderOptions{0, c.keep, 0, 0});
    const auto want0 = epoch_bytes(ref, 0, c.keep), want1 = epoch_bytes(ref, 1, c.keep);
    for (int w : {0, 1, 3})
      for (int64_t rows : {int64_t(0), int64_t(1), int64_t(5)})
        for (int prefetch : {1, 3}) {
          const std::string what = str_cat(c.what, ": workers ", w, " rows per claim ", rows, " prefetch ", prefetch);
          BatchLoader L(ds, c.batch, true, 7, c.train, c.shard, LoaderOptions{prefetch, c.keep, w, rows});
          EXPECT_EQ(L.workers(), w) << what;
          EXPECT_TRUE(epoch_bytes(L, 0, c.keep) == want0) << what;
          EXPECT_TRUE(epoch_bytes(L, 1, c.keep) == want1) << what;
          // Resuming mid-epoch: the rest of the epoch, the same bytes.
          const auto rest = epoch_bytes(L, 1, c.keep, 2);
          ASSERT_EQ(rest.size() + 2, want1.size()) << what;
          EXPECT_TRUE(std::equal(rest.begin(), rest.end(), want1.begin() + 2)) << what;
        }
  }
}

TEST(DataLoaderWorkers, ErrorsComeInOrderAndTheLoaderStaysFailed) {
  // Sample 13 (batch 3 of 4-row batches in file order) is unreadable: batches 0-2 first.
  ThrowingDataset one;
  for (int w : {1, 2, 4})
    for (int64_t rows : {int64_t(0), int64_t(1), int64_t(3)}) {
      BatchLoader L(one, 4, false, 0, true, Sharding{}, LoaderOptions{3, 1, w, rows});
      Batch b;
      int got = 0;
      try {
        while (L.next(b)) ++got;
        ADD_FAILURE() << "expected the dataset's error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("sample 13"), std::string::npos) << e.what();
      }
      EXPECT_EQ(got, 3) << "workers " << w << " rows " << rows << ": the batches before the bad one";
      EXPECT_THROW(L.next(b), Error) << "a failed loader stays failed";
      L.start_epoch(1);
      EXPECT_THROW(L.next(b), Error) << "also in a new epoch";
    }
  // Two bad samples: 9 (batch 2) fails late, 13 (batch 3) at once. Whatever the workers
  // meet first, next() throws what a synchronous read throws: sample 9's error, after 2 batches.
  FailingDataset two({9, 13}, 9);
  for (int w : {0, 3, 6}) {
    BatchLoader L(two, 4, false, 0, true, Sharding{}, LoaderOptions{4, 1, w, 1});
    Batch b;
    int got = 0;
    std::string message;
    try {
      while (L.next(b)) ++got;
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_EQ(got, 2) << "workers " << w;
    EXPECT_NE(message.find("sample 9 "), std::string::npos) << "workers " << w << ": " << message;
  }
}

TEST(DataLoaderWorkers, WorkersReadAtOnceAndStopWhenDestroyed) {
  // Every reader waits until 3 are inside get() at once: only 3 workers reading together
  // get past it (a hang would end in 20 s and fail the counts).
  {
    SlowDataset ds(600, 100, 3);
    BatchLoader L(ds, 6, true, 1, true, Sharding{}, LoaderOptions{2, 1, 3, 0});
    Batch b;
    for (int k = 0; k < 5; ++k) ASSERT_TRUE(L.next(b));
    EXPECT_EQ(ds.most(), 3);
    EXPECT_EQ(L.stats().max_reading, 3);
  }
  // Destroyed with workers reading, mid-epoch, before any epoch, or right after a restart:
  // every worker is joined and no reader is left inside the dataset.
  SlowDataset ds(10000, 1000);
  for (int k = 0; k < 6; ++k) {
    {
      BatchLoader L(ds, 16, true, uint64_t(k), true, Sharding{}, LoaderOptions{3, 2, 4, 0});
      Batch b;
      if (k % 3 >= 1) {
        ASSERT_TRUE(L.next(b));
      }
      if (k % 3 == 2) L.start_epoch(1, 3);
    }
    EXPECT_EQ(ds.inside(), 0);
  }
  const int64_t reads = ds.reads();
  EXPECT_LT(reads, 10000) << "a destroyed loader does not read on";
}

TEST(DataLoaderWorkers, MoreWorkersLeaveTheConsumerWaitingLess) {
  // A batch of 6 slow samples (1.5 ms each: 9 ms for one reader, 3 ms for three) behind a
  // consumer that spends 6 ms per batch: one worker falls behind, three keep up. Counted:
  // the next() calls that found their batch already read (no clock is asserted).
  SlowDataset ds(6 * 30, 1500);
  int64_t ready[4] = {0, 0, 0, 0};
  for (int w : {1, 3}) {
    BatchLoader L(ds, 6, false, 0, true, Sharding{}, LoaderOptions{2, 1, w, 0});
    Batch b;
    int64_t n = 0;
    while (L.next(b)) {
      ++n;
      std::this_thread::sleep_for(std::chrono::milliseconds(6));
    }
    EXPECT_EQ(n, 30);
    const LoaderStats st = L.stats();
    EXPECT_EQ(st.ready + st.waited, 30);
    ready[w] = st.ready;
  }
  EXPECT_GT(ready[3], ready[1]) << "three workers: " << ready[3] << " of 30 batches ready, one: " << ready[1];
}

TEST(DataLoaderWorkers, AutoRuleAndHostMemory) {
  EXPECT_EQ(auto_loader_workers(2, 1, 2), 1) << "a CPU run on every core: one reader";
  EXPECT_EQ(auto_loader_workers(4, 1, 2), 2) << "--threads 2 of 4 cores: the 2 left";
  EXPECT_EQ(auto_loader_workers(16, 1, 1), 8) << "a GPU rank: its cores but one, 8 at most";
  EXPECT_EQ(auto_loader_workers(64, 8, 1), 7);
  EXPECT_EQ(auto_loader_workers(8, 8, 1), 1);
  EXPECT_EQ(auto_loader_workers(0, 0, 0), 1);
  // The ring does not depend on the workers; the scratch is per reading thread.
  SlowDataset ds(100, 0);
  for (int w : {0, 1, 3}) {
    const size_t before = mem_stats().current;
    {
      BatchLoader L(ds, 5, true, 0, true, Sharding{}, LoaderOptions{2, 2, w, 0});
      EXPECT_EQ(mem_stats().current - before, BatchLoader::buffer_bytes(ds, 5, BatchLoader::ring_slots(2, 2)));
      EXPECT_EQ(BatchLoader::ring_slots(2, 2), 3);
    }
    EXPECT_EQ(mem_stats().current, before);
    EXPECT_EQ(BatchLoader::worker_host_bytes(ds, LoaderOptions{2, 1, w, 0}), size_t(std::max(w, 1)) * 1000)
        << "workers " << w << " (none: the consumer reads)";
  }
  EXPECT_EQ(BatchLoader::worker_host_bytes(ds, LoaderOptions{0, 1, 3, 0}), 1000u) << "prefetch 0: the consumer reads";
  EXPECT_EQ(BatchLoader::ring_slots(0, 3), 3) << "prefetch 0 keeps its `keep` batches";
}
