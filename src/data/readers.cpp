// File formats: IDX (MNIST / Fashion-MNIST, gzip or plain), CIFAR-10 binary batches,
// gzip-compressed llm.c token shards (token_shards.cpp maps the plain ones). Every file is
// read through zlib's gz* calls, which read gzip and plain files alike. Every failure is a sat::Error naming the file and what was expected.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "backend/device.h"
#include "core/io.h"
#include "data/gz_open.h"
#include "data/sources.h"

namespace sat {

gzFile_s* gz_open_data(const std::string& path) {
  const int fd = InputFile("--data", path).release();  // a FIFO or device refused, not waited on
  errno = 0;
  gzFile f = gzdopen(fd, "rb");
  if (!f) {
    ::close(fd);
    fail(path, ": cannot open (", errno ? std::strerror(errno) : "out of memory", ")");
  }
  return f;
}

}  // namespace sat

namespace sat::data_detail {
namespace {

namespace fs = std::filesystem;

// A file opened for reading through zlib (gzip or plain).
class GzFile {
 public:
  explicit GzFile(std::string path) : path_(std::move(path)) {
    f_ = gz_open_data(path_);
    gzbuffer(f_, 1 << 18);
  }
  ~GzFile() { gzclose(f_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  const std::string& path() const { return path_; }

  // zlib's message, without the "path: " prefix it adds.
  std::string zlib_error(int* errnum) {
    std::string msg = gzerror(f_, errnum);
    if (msg.rfind(path_ + ": ", 0) == 0) msg.erase(0, path_.size() + 2);
    return msg;
  }
  // Reads up to n bytes; fewer only at the end of the data. Throws on a read error.
  size_t read(void* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      unsigned chunk = unsigned(std::min<size_t>(n - got, size_t(1) << 30));
      int r = gzread(f_, static_cast<char*>(dst) + got, chunk);
      if (r < 0) {
        int errnum = 0;
        std::string msg = zlib_error(&errnum);
        fail(path_, ": read error after ", got_total_ + got, " bytes: ", msg,
             errnum == Z_BUF_ERROR ? " (the gzip stream is truncated)" : " (corrupt gzip data?)");
      }
      if (r == 0) break;
      got += size_t(r);
    }
    // zlib reports a gzip stream cut short as Z_BUF_ERROR after returning what it had.
    if (got < n) {
      int errnum = 0;
      std::string msg = zlib_error(&errnum);
      if (errnum != Z_OK)
        fail(path_, ": read error after ", got_total_ + got, " bytes: ", msg,
             errnum == Z_BUF_ERROR ? " (the gzip stream is truncated)" : " (corrupt gzip data?)");
    }
    got_total_ += got;
    return got;
  }
  void read_exact(void* dst, size_t n, const std::string& what) {
    size_t got = read(dst, n);
    if (got != n)
      fail(path_, ": truncated: expected ", n, " bytes of ", what, " but the file ends after ", got,
           " of them (", got_total_, " bytes in all)");
  }
  // Reads n elements into a vector grown as data arrives, so a corrupt header claiming
  // a huge size fails as "truncated" instead of allocating it all up front.
  template <typename T>
  std::vector<T> read_vector(size_t n, const std::string& what) {
    std::vector<T> v;
    v.reserve(std::min<size_t>(n, (size_t(64) << 20) / sizeof(T)));
    while (v.size() < n) {
      size_t old = v.size(), want = std::min<size_t>(n - old, std::max<size_t>(old, size_t(1) << 20));
      v.resize(old + want);
      size_t got = read(v.data() + old, want * sizeof(T));
      if (got < want * sizeof(T))
        fail(path_, ": truncated: expected ", n * sizeof(T), " bytes of ", what, " but the file ends after ",
             old * sizeof(T) + got, " of them");
    }
    return v;
  }
  bool at_end() {
    uint8_t b;
    return read(&b, 1) == 0;
  }
  // Reads and discards up to n bytes (nothing is kept: a gzip bomb costs time, not memory);
  // returns how many there were.
  uint64_t skip(uint64_t n) {
    std::vector<uint8_t> buf(size_t(1) << 18);
    uint64_t got = 0;
    while (got < n) {
      const size_t want = size_t(std::min<uint64_t>(n - got, buf.size()));
      const size_t r = read(buf.data(), want);
      got += r;
      if (r < want) break;
    }
    return got;
  }
  // Back to the first byte (of the decompressed data).
  void rewind() {
    SAT_CHECK(gzrewind(f_) == 0, path_, ": cannot seek back to the start of the file");
    got_total_ = 0;
  }
  // True when the file is gzip data (zlib reads plain files as they are).
  bool compressed() const { return gzdirect(f_) == 0; }

 private:
  std::string path_;
  gzFile f_ = nullptr;
  size_t got_total_ = 0;
};

uint32_t be32(const uint8_t* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }

std::string mib_text(uint64_t bytes) { return str_cat(bytes / 1048576, " MiB"); }

// The last 4 bytes of a gzip file: ISIZE, the decompressed size of its (last) member
// modulo 2^32. -1 when it cannot be read.
int64_t gzip_isize(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f || f.tellg() < 18) return -1;
  f.seekg(-4, std::ios::end);
  uint8_t b[4];
  if (!f.read(reinterpret_cast<char*>(b), 4)) return -1;
  return int64_t(uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24);
}

// Before a reader allocates what a header declares (f is just past the header of
// header_bytes): refuses a size beyond the free memory, and a gzip file whose data does not
// decompress to exactly `declared` bytes, so that a small file cannot make it allocate
// gigabytes. The data is decompressed once and counted without keeping it, and f is put
// back just past the header; up to 256 MiB, a gzip trailer whose size (modulo 2^32) agrees
// is taken at its word instead (a forged one costs at most that much memory before the
// reader finds the excess). `what` says what the header declares ("2147483648 images of
// 28x28"). A plain file needs neither: it is read as it arrives, so it cannot make the
// reader hold more than its own size.
void check_declared(GzFile& f, uint64_t header_bytes, uint64_t declared, const std::string& what) {
  const uint64_t avail = host_available_memory();
  SAT_CHECK(!avail || declared <= avail, f.path(), ": its header declares ", what, " = ", declared, " bytes (",
            mib_text(declared), "), more than the ", mib_text(avail),
            " of free memory; expected a smaller count (corrupt header?)");
  if (!f.compressed()) return;
  if (declared <= (uint64_t(256) << 20) && gzip_isize(f.path()) == int64_t(uint32_t(header_bytes + declared))) return;
  const uint64_t n = f.skip(declared + 1);
  SAT_CHECK(n <= declared, f.path(), ": the gzip data decompresses to more than the ", header_bytes + declared,
            " bytes its header declares (", what, " after a ", header_bytes,
            "-byte header); expected exactly that many (a corrupt header, or a gzip bomb?)");
  SAT_CHECK(n == declared, f.path(), ": truncated: expected ", declared, " bytes of ", what,
            " but the gzip data ends after ", n, " of them");
  f.rewind();
  f.skip(header_bytes);
}

bool is_file(const std::string& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// ---------------------------------------------------------------- IDX

struct Idx {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;
};

// magic 2049 = 0x00000801 (unsigned bytes, 1 dim: labels), 2051 = 0x00000803 (3 dims: images).
Idx read_idx(const std::string& path, uint32_t magic) {
  const char* kind = magic == 2049 ? "an idx1-ubyte label file" : "an idx3-ubyte image file";
  GzFile f(path);
  uint8_t hdr[4];
  f.read_exact(hdr, 4, "IDX header");
  uint32_t m = be32(hdr);
  if (m != magic) {
    std::string hint;
    if (m == 2049) hint = " (this is a label file)";
    if (m == 2051) hint = " (this is an image file)";
    fail(path, ": IDX magic number is ", m, hint, "; expected ", magic, " (", kind, ")");
  }
  Idx idx;
  const int nd = int(magic & 0xff);
  std::vector<uint8_t> dims(size_t(nd) * 4);
  f.read_exact(dims.data(), dims.size(), "IDX dimensions");
  // The product in 128 bits: three 32-bit dimensions overflow 64 (and a wrapped product
  // could pass for a small one).
  unsigned __int128 product = 1;
  std::string what = nd == 1 ? "" : " images of ";
  for (int i = 0; i < nd; ++i) {
    idx.dims.push_back(be32(&dims[size_t(i) * 4]));
    product *= idx.dims.back();
    if (i > 0) what += str_cat(i > 1 ? "x" : "", idx.dims.back());
  }
  what = nd == 1 ? str_cat(idx.dims[0], " labels") : str_cat(idx.dims[0], what);
  SAT_CHECK(product > 0, path, ": IDX file has a zero dimension; expected at least one ", nd == 1 ? "label" : "image");
  SAT_CHECK(product < (uint64_t(1) << 48), path, ": its IDX header declares ", what,
            ", implausibly large (256 TiB or more); corrupt header?");
  const uint64_t total = uint64_t(product);
  check_declared(f, 4 + dims.size(), total, what);
  idx.data = f.read_vector<uint8_t>(size_t(total), nd == 1 ? "labels" : "pixels");
  SAT_CHECK(f.at_end(), path, ": holds more data than its IDX header says (", total,
            " bytes); expected exactly that many");
  return idx;
}

struct IdxFiles {
  std::string images, labels;
};

std::string find_idx_file(const std::string& tag, const std::string& dir, bool is_default,
                          const std::string& stem, const char* kind) {
  // Standard names (train-images-idx3-ubyte), and the dotted variant (train-images.idx3-ubyte)
  // some mirrors use; each gzipped or plain.
  const std::string base = stem + "-" + kind, dotted = stem + "." + kind;
  for (const auto& name : {base + ".gz", base, dotted + ".gz", dotted}) {
    std::string p = (fs::path(dir) / name).string();
    if (is_file(p)) return p;
  }
  std::string p = (fs::path(dir) / (base + ".gz")).string();
  if (tag == "fashion-mnist")
    fail(p, ": not found (nor ", base, " without .gz); Fashion-MNIST comes from Debian's dataset-fashion-mnist "
         "package (apt-get install dataset-fashion-mnist)",
         is_default ? "; or give --data fashion-mnist:DIR or mnist:DIR with the IDX files" : "");
  fail(p, ": not found (nor ", base, ", ", dotted, ".gz, ", dotted, "); --data ", tag, ":", dir,
       " expects the IDX files train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
       "t10k-labels-idx1-ubyte (gzip or plain)");
}

std::unique_ptr<Dataset> load_idx_split(const std::string& name, const std::string& img_path,
                                        const std::string& lbl_path, const DataOptions& opt) {
  Idx img = read_idx(img_path, 2051);
  Idx lbl = read_idx(lbl_path, 2049);
  SAT_CHECK(img.dims[0] == lbl.dims[0], img_path, " holds ", img.dims[0], " images but ", lbl_path, " holds ",
            lbl.dims[0], " labels; expected the same number");
  for (size_t i = 0; i < lbl.data.size(); ++i)
    SAT_CHECK(lbl.data[i] < 10, lbl_path, ": label ", int(lbl.data[i]), " at index ", i, "; expected 0..9");
  Shape chw{1, int64_t(img.dims[1]), int64_t(img.dims[2])};
  return std::make_unique<U8ImageDataset>(name, chw, 10, std::move(img.data), std::move(lbl.data),
                                          pixel_lut(1, opt), scaling_text(opt));
}

// ---------------------------------------------------------------- CIFAR-10

constexpr size_t kCifarRecord = 1 + 3072;

void read_cifar_file(const std::string& path, std::vector<uint8_t>& px, std::vector<uint8_t>& labels) {
  GzFile f(path);
  // The size before allocating it: the file's own, or for gzip the data decompressed once
  // and counted (never more than the free memory: a gzip bomb is refused, not held).
  uint64_t size = 0;
  if (f.compressed()) {
    const uint64_t avail = host_available_memory();
    const uint64_t limit = avail ? avail : uint64_t(1) << 40;
    size = f.skip(limit + 1);
    SAT_CHECK(size <= limit, path, ": the gzip data decompresses to more than the ", mib_text(limit),
              " of free memory; expected CIFAR-10 records of 3073 bytes, 30730000 bytes for 10000 images "
              "(a gzip bomb?)");
    f.rewind();
  } else {
    std::error_code ec;
    size = fs::file_size(path, ec);
    SAT_CHECK(!ec, path, ": cannot read its size (", ec.message(), ")");
  }
  SAT_CHECK(size > 0 && size % kCifarRecord == 0, path, ": ", size,
            " bytes is not a whole number of CIFAR-10 records; expected a multiple of 3073 "
            "(1 label byte + 3072 pixel bytes, CHW 3x32x32), e.g. 30730000 for 10000 images");
  std::vector<uint8_t> raw = f.read_vector<uint8_t>(size_t(size), "CIFAR-10 records");
  SAT_CHECK(f.at_end(), path, ": grew while being read; expected ", size, " bytes");
  SAT_CHECK(!raw.empty() && raw.size() % kCifarRecord == 0, path, ": ", raw.size(),
            " bytes is not a whole number of CIFAR-10 records; expected a multiple of 3073 "
            "(1 label byte + 3072 pixel bytes, CHW 3x32x32), e.g. 30730000 for 10000 images");
  const size_t n = raw.size() / kCifarRecord;
  px.reserve(px.size() + n * 3072);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* r = raw.data() + i * kCifarRecord;
    SAT_CHECK(r[0] < 10, path, ": label ", int(r[0]), " in record ", i,
              "; expected 0..9 (is this CIFAR-100? only CIFAR-10 is supported)");
    labels.push_back(r[0]);
    px.insert(px.end(), r + 1, r + kCifarRecord);
  }
}

}  // namespace

DataSplit open_idx(const std::string& tag, const std::string& dir, bool is_default, const DataOptions& opt) {
  std::string tr_img = find_idx_file(tag, dir, is_default, "train-images", "idx3-ubyte");
  std::string tr_lbl = find_idx_file(tag, dir, is_default, "train-labels", "idx1-ubyte");
  std::string te_img = find_idx_file(tag, dir, is_default, "t10k-images", "idx3-ubyte");
  std::string te_lbl = find_idx_file(tag, dir, is_default, "t10k-labels", "idx1-ubyte");
  DataSplit s;
  s.train = load_idx_split(tag + " train", tr_img, tr_lbl, opt);
  s.test = load_idx_split(tag + " test", te_img, te_lbl, opt);
  SAT_CHECK(s.train->sample_shape() == s.test->sample_shape(), te_img, ": images are ",
            s.test->sample_shape().str(), " but the training images are ", s.train->sample_shape().str(),
            "; expected the same shape");
  s.description = str_cat(tag, " (", dir, "): ", s.train->size(), " train / ", s.test->size(), " test images ",
                          s.train->sample_shape().str(), ", 10 classes, ", scaling_text(opt));
  return s;
}

DataSplit open_cifar10(const std::string& dir_in, const DataOptions& opt) {
  std::string dir = dir_in;
  if (!is_file((fs::path(dir) / "data_batch_1.bin").string()) &&
      is_file((fs::path(dir) / "cifar-10-batches-bin" / "data_batch_1.bin").string()))
    dir = (fs::path(dir) / "cifar-10-batches-bin").string();  // the tarball's own folder
  auto need = [&](const std::string& name) {
    std::string p = (fs::path(dir) / name).string();
    SAT_CHECK(is_file(p), p, ": not found; --data cifar10:DIR expects the CIFAR-10 binary version "
              "(data_batch_1.bin .. data_batch_5.bin, test_batch.bin) in DIR");
    return p;
  };
  std::vector<std::string> train_files;
  for (int b = 1; b <= 5; ++b) train_files.push_back(need(str_cat("data_batch_", b, ".bin")));
  std::string test_file = need("test_batch.bin");
  std::vector<uint8_t> px, labels;
  for (auto& p : train_files) read_cifar_file(p, px, labels);
  DataSplit s;
  Shape chw{3, 32, 32};
  s.train = std::make_unique<U8ImageDataset>("cifar10 train", chw, 10, std::move(px), std::move(labels),
                                             pixel_lut(3, opt), scaling_text(opt));
  px.clear();
  labels.clear();
  read_cifar_file(test_file, px, labels);
  s.test = std::make_unique<U8ImageDataset>("cifar10 test", chw, 10, std::move(px), std::move(labels),
                                            pixel_lut(3, opt), scaling_text(opt));
  s.description = str_cat("cifar10 (", dir, "): ", s.train->size(), " train / ", s.test->size(),
                          " test images [3, 32, 32], 10 classes, ", scaling_text(opt));
  return s;
}

std::vector<uint8_t> read_gzip_token_shard(const std::string& path,
                                           const std::function<uint64_t(const int32_t* header)>& payload_bytes) {
  GzFile f(path);
  int32_t hdr[256];
  f.read_exact(hdr, sizeof(hdr), "token-shard header (256 int32)");
  const uint64_t n = payload_bytes(hdr);
  check_declared(f, sizeof(hdr), n, str_cat(n, " bytes of tokens"));
  std::vector<uint8_t> tok = f.read_vector<uint8_t>(n, "tokens (the header's count)");
  SAT_CHECK(f.at_end(), path, ": holds more than the ", hdr[2], " tokens its header says (", sizeof(hdr) + n,
            " bytes); expected exactly that many");
  return tok;
}

}  // namespace sat::data_detail
