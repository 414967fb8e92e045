// --data images:DIR[:VALDIR] (images.h): the folder's index, its check for bad files, the schema
// saved with the weights, and the dataset that decodes a file per sample.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/rng.h"
#include "core/text.h"
#include "data/images.h"
#include "data/sources.h"

namespace sat::data_detail {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kAugmentStream = 0x6175676d656e74ull;  // "augment"

// ---------------------------------------------------------------- the schema

// What a model trained on an image folder reads other folders with: its classes by name, the
// image shape and the scaling (empty mean and std: pixels/255).
struct ImageSchema {
  std::vector<std::string> classes;
  std::vector<int64_t> shape;  // C, H, W
  std::vector<float> mean, std;

  std::string to_json() const {
    nlohmann::ordered_json j;
    j["format"] = "saturate images 1";
    j["classes"] = classes;
    j["shape"] = shape;
    j["mean"] = mean;
    j["std"] = std;
    return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace);
  }

  static ImageSchema from_json(const std::string& text, const std::string& where) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    SAT_CHECK(!(j.is_object() && j.value("format", "") == "saturate table 1"), where, ": the weights were trained on "
              "a table (--data csv:), not on images; expected --data csv:FILE");
    SAT_CHECK(j.is_object() && j.value("format", "") == "saturate images 1", where, ": the data description is not "
              "one saturate wrote (expected \"format\": \"saturate images 1\")");
    ImageSchema s;
    try {
      s.classes = j.at("classes").get<std::vector<std::string>>();
      s.shape = j.at("shape").get<std::vector<int64_t>>();
      s.mean = j.at("mean").get<std::vector<float>>();
      s.std = j.at("std").get<std::vector<float>>();
    } catch (const nlohmann::json::exception&) {
      fail(where, ": the image data description lacks classes, shape, mean or std, or holds values of another type");
    }
    SAT_CHECK(!s.classes.empty() && s.shape.size() == 3 && s.mean.size() == s.std.size(), where, ": the image data "
              "description has ", s.classes.size(), " classes, a shape of ", s.shape.size(), " dimensions, ",
              s.mean.size(), " means and ", s.std.size(), " stds; expected classes, [C, H, W], as many means as stds");
    return s;
  }
};

// ---------------------------------------------------------------- the index

// A folder's images, as opened (DIR/CLASS/...), with their classes (-1: none, a flat folder).
struct Files {
  std::string root;
  std::vector<std::string> paths;
  std::vector<int32_t> labels;
  size_t bytes() const {
    size_t b = root.capacity() + labels.capacity() * sizeof(int32_t) + paths.capacity() * sizeof(std::string);
    for (const std::string& p : paths) b += p.capacity() + 1;
    return b;
  }
};

bool is_dir(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);  // a link to a folder counts
}

bool image_name(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  std::string ext = name.substr(dot + 1);
  for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

// A folder's entries: its subfolders (none whose name starts with '.') and its image files,
// each sorted by name.
void list_folder(const std::string& dir, std::vector<std::string>& folders, std::vector<std::string>& images) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_dir(dir + "/" + name)) {
      if (name[0] != '.') folders.push_back(name);
    } else if (image_name(name)) {
      images.push_back(name);
    }
  }
  SAT_CHECK(!ec, dir, ": cannot list the folder (", ec.message(), ")");
  std::sort(folders.begin(), folders.end());
  std::sort(images.begin(), images.end());
}

// Every image under `dir` in torchvision's order (sorted(os.walk(dir, followlinks=True)): the
// folders by their paths, each one's files by name). A folder reached twice through links is
// read once.
void walk(const std::string& dir, int32_t label, Files& out) {
  std::vector<std::pair<std::string, std::vector<std::string>>> found;
  std::set<std::string> seen;
  std::vector<std::string> todo{dir};
  while (!todo.empty()) {
    const std::string d = todo.back();
    todo.pop_back();
    std::error_code ec;
    const fs::path real = fs::weakly_canonical(d, ec);
    if (!seen.insert(ec ? d : real.string()).second) continue;
    std::vector<std::string> folders, images;
    list_folder(d, folders, images);
    for (const std::string& f : folders) todo.push_back(d + "/" + f);
    found.emplace_back(d, std::move(images));
  }
  std::sort(found.begin(), found.end());
  for (const auto& [d, images] : found)
    for (const std::string& name : images) {
      out.paths.push_back(d + "/" + name);
      out.labels.push_back(label);
    }
}

// The folder's class folders, or (flat_ok: predict) its own images without classes. `classes`:
// the classes to read them as (eval and predict: the weights', a val folder: the training
// folder's), or empty to take the folder's own.
Files scan_folder(const std::string& dir, std::vector<std::string>& classes, bool flat_ok) {
  SAT_CHECK(is_dir(dir), "--data images:", dir, ": ", dir, " is not a folder; expected a folder of class folders "
            "(DIR/CLASS/IMAGE.png)");
  Files f;
  f.root = dir;
  std::vector<std::string> found, images;
  list_folder(dir, found, images);
  if (found.empty()) {
    SAT_CHECK(flat_ok, dir, ": no class folders; expected one folder per class holding its images (", dir,
              "/CLASS/IMAGE.png)");
    SAT_CHECK(!images.empty(), dir, ": no class folders and no .jpg, .jpeg or .png images; expected images, or one "
              "folder per class holding its images");
    for (const std::string& name : images) f.paths.push_back(dir + "/" + name), f.labels.push_back(-1);
    return f;
  }
  if (classes.empty()) classes = found;
  std::map<std::string, int32_t> index;
  for (size_t c = 0; c < classes.size(); ++c) index[classes[c]] = int32_t(c);
  for (const std::string& name : found) {
    const auto it = index.find(name);
    SAT_CHECK(it != index.end(), dir, "/", name, ": class '", name, "' is not one of the ", classes.size(),
              " classes of the training data (", names_list(classes), ")");
    const size_t before = f.paths.size();
    walk(dir + "/" + name, it->second, f);
    SAT_CHECK(f.paths.size() > before, dir, "/", name, ": an empty class folder (no .jpg, .jpeg or .png images in it "
              "or its subfolders); expected at least one image, or no folder");
  }
  return f;
}

// ---------------------------------------------------------------- bad files

struct BadFiles {
  int64_t count = 0;
  std::string first;  // "PATH: what is wrong"
};

// Every file's header and end (images.h), checked on a few threads; the bad ones are counted
// and left out of `f`.
void check_files(Files& f, BadFiles& bad) {
  const size_t n = f.paths.size();
  std::vector<std::string> problem(n);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < n;) {
      try {
        problem[i] = image_file_problem(f.paths[i]);
      } catch (const std::exception& e) {
        problem[i] = e.what();
      }
    }
  };
  const unsigned threads = std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8);
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads && t < n; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!problem[i].empty()) {
      if (bad.count++ == 0) bad.first = f.paths[i] + ": " + problem[i];
      continue;
    }
    if (kept != i) f.paths[kept] = std::move(f.paths[i]), f.labels[kept] = f.labels[i];
    ++kept;
  }
  f.paths.resize(kept);
  f.labels.resize(kept);
}

// ---------------------------------------------------------------- the dataset

// What the splits of one folder share.
struct Setup {
  Shape chw;
  std::vector<float> lut;  // C*256
  std::string scaling;
  ImageAugment augment;
  uint64_t seed = 0;
  int64_t classes = 0;
  std::vector<std::string> names;
  std::string schema;
};

class ImageFolderDataset : public Dataset {
 public:
  ImageFolderDataset(std::string name, std::shared_ptr<const Files> files, std::vector<int64_t> rows,
                     std::shared_ptr<const Setup> setup)
      : name_(std::move(name)), files_(std::move(files)), rows_(std::move(rows)), s_(std::move(setup)) {}
  int64_t size() const override { return rows_.empty() ? int64_t(files_->paths.size()) : int64_t(rows_.size()); }
  Shape sample_shape() const override { return s_->chw; }
  DType sample_dtype() const override { return DType::f32; }
  Shape label_shape() const override { return Shape{}; }
  int64_t num_classes() const override { return s_->classes; }
  std::string name() const override { return name_; }
  std::string scaling() const override { return s_->scaling; }
  size_t storage_bytes() const override {
    return files_->bytes() + rows_.capacity() * sizeof(int64_t) + s_->lut.size() * sizeof(float);
  }
  std::vector<std::string> class_names() const override { return s_->names; }
  std::string schema() const override { return s_->schema; }
  std::string schema_file() const override { return "images.json"; }
  std::string sample_name(int64_t i) const override { return file(i).substr(files_->root.size() + 1); }

  void get(int64_t i, void* x, int32_t* y) const override {
    write(resize_center_crop(load(i), int(s_->chw[1]), int(s_->chw[2])), x);
    *y = label(i);
  }

  void get_train(int64_t i, int64_t epoch, void* x, int32_t* y) const override {
    if (!s_->augment.any()) return get(i, x, y);
    Rng rng(mix_seed(mix_seed(mix_seed(s_->seed, kAugmentStream), uint64_t(epoch)), uint64_t(i)));
    const int H = int(s_->chw[1]), W = int(s_->chw[2]);
    Image im = load(i);
    if (s_->augment.crop) {
      const CropBox b = random_resized_crop(im.height, im.width, rng);
      im = resize_bilinear(crop_image(im, b.top, b.left, b.height, b.width), W, H);
    } else {
      im = resize_center_crop(im, H, W);
    }
    if (s_->augment.flip && rng.uniform() < 0.5f) flip_horizontal(im);
    write(im, x);
    *y = label(i);
  }

 private:
  size_t row(int64_t i) const { return rows_.empty() ? size_t(i) : size_t(rows_[size_t(i)]); }
  const std::string& file(int64_t i) const { return files_->paths[row(i)]; }
  int32_t label(int64_t i) const { return files_->labels[row(i)]; }
  Image load(int64_t i) const { return load_image(file(i), int(s_->chw[0])); }
  // HWC bytes -> CHW floats through the scaling table.
  void write(const Image& im, void* x) const {
    SAT_ASSERT(im.width == s_->chw[2] && im.height == s_->chw[1] && im.channels == s_->chw[0]);
    const int64_t C = im.channels, hw = int64_t(im.width) * im.height;
    float* dst = static_cast<float*>(x);
    for (int64_t c = 0; c < C; ++c) {
      const float* lut = s_->lut.data() + c * 256;
      for (int64_t j = 0; j < hw; ++j) dst[c * hw + j] = lut[im.pixels[size_t(j * C + c)]];
    }
  }

  std::string name_;
  std::shared_ptr<const Files> files_;
  std::vector<int64_t> rows_;  // empty: all of files_'
  std::shared_ptr<const Setup> s_;
};

// ---------------------------------------------------------------- opening

// The model's input as an image: C x H x W with C 1 or 3; a flat input {1, 1, N} (an mlp of
// another width) is read as C x S x S where N = C S^2 (at most one of 1 and 3 fits).
Shape image_shape(const DataOptions& opt, const std::string& spec) {
  const Shape s = opt.image_shape;
  SAT_CHECK(s.nd == 3 && s.numel() > 0, "--data ", spec, ": the model's input ", s.str(), " is not C, H, W");
  if (s[0] == 1 && s[1] == 1) {
    for (int64_t c : {1, 3}) {
      const int64_t side = std::llround(std::sqrt(double(s[2] / c)));
      if (s[2] % c == 0 && side * side == s[2] / c) return Shape{c, side, side};
    }
    fail("--data ", spec, ": the model takes ", s[2], " values, which is not an image of 1 or 3 channels (C x S x S); "
         "expected an mlp of 784 (1x28x28) or 3072 (3x32x32) inputs, say, or a model taking [C, H, W]");
  }
  SAT_CHECK(s[0] == 1 || s[0] == 3, "--data ", spec, ": the model's input ", s.str(), " has ", s[0], " channels; "
            "expected 1 (gray) or 3 (RGB)");
  return s;
}

std::string without_trailing_slash(std::string d) {
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d;
}

// The schema's scaling as options (for the pixel table and its text), after checking that a
// --normalize given agrees with it.
DataOptions scaling_of(const ImageSchema& s, const DataOptions& opt, const Shape& chw) {
  SAT_CHECK(s.shape == std::vector<int64_t>({chw[0], chw[1], chw[2]}), "--init-weights: the weights were trained on "
            "images of shape [", s.shape[0], ", ", s.shape[1], ", ", s.shape[2], "], but the model takes ", chw.str());
  SAT_CHECK(opt.mean.empty() || (opt.mean == s.mean && opt.std == s.std), "--normalize: the weights were trained with ",
            s.mean.empty() ? std::string("pixels/255") : "other means and stds", " (their data description holds "
            "it); leave --normalize out");
  DataOptions o = opt;
  o.mean = s.mean, o.std = s.std;
  return o;
}

// The line the log shows: the folder, the splits, the classes, the shape, the scaling.
std::string describe(const std::string& dir, const DataSplit& d, bool test_only, const std::string& how,
                     const std::vector<std::string>& classes, const Setup& s, const BadFiles& bad) {
  std::string t = str_cat("images (", dir, "): ");
  if (!test_only) t += str_cat(d.train->size(), " train", d.test ? " / " : " images (no test split), ");
  if (d.test) t += str_cat(d.test->size(), " test (", how, ") images, ");
  t += str_cat(classes.empty() ? str_cat("no class folders (", s.classes, " classes)")
                                           : str_cat(classes.size(), " classes (", names_list(classes), ")"),
               ", resized and centre-cropped to ", s.chw.str(), ", ", s.scaling);
  if (s.augment.any())
    t += str_cat(", --augment ", s.augment.crop ? "crop" : "", s.augment.crop && s.augment.flip ? "," : "",
                 s.augment.flip ? "flip" : "");
  if (bad.count)
    t += str_cat(", ", bad.count, " bad file", bad.count == 1 ? "" : "s", " left out (--skip-bad-images; ", bad.first,
                 ")");
  return t;
}

}  // namespace

DataSplit open_images(const std::string& dir_in, const std::string& val_in, const DataOptions& opt) {
  const std::string spec = "images:" + dir_in + (val_in.empty() ? "" : ":" + val_in);
  const std::string dir = without_trailing_slash(dir_in), val = without_trailing_slash(val_in);
  const Shape chw = image_shape(opt, spec);
  auto setup = std::make_shared<Setup>();
  setup->chw = chw;
  setup->augment = parse_augment(opt.augment);
  setup->seed = opt.seed;
  SAT_CHECK(opt.val_fraction == 0 || (opt.val_fraction > 0 && opt.val_fraction < 1), "--val-fraction ",
            opt.val_fraction, ": expected a fraction of the images between 0 and 1, such as 0.2");
  // The folders: DIR/train and DIR/val (torchvision's convention), or DIR and VALDIR.
  const bool split = is_dir(dir + "/train") && is_dir(dir + "/val");
  SAT_CHECK(!split || val.empty(), "--data ", spec, ": ", dir, " has train/ and val/ folders of its own; expected "
            "images:", dir, " alone, or a folder of class folders with VALDIR");
  const std::string train_dir = split ? dir + "/train" : dir, test_dir = split ? dir + "/val" : val;
  SAT_CHECK(test_dir.empty() || opt.val_fraction == 0, "--val-fraction: not with --data ", spec, " (",
            test_dir, " is the test split)");
  std::vector<std::string> classes;
  DataOptions scaled = opt;
  if (!opt.table.empty()) {
    const ImageSchema s = ImageSchema::from_json(opt.table, "--init-weights");
    classes = s.classes;
    scaled = scaling_of(s, opt, chw);
  }
  setup->lut = pixel_lut(chw[0], scaled);
  setup->scaling = scaling_text(scaled);
  // The index, without the bad files (every rank finds the same ones).
  // eval and predict with the weights' classes read the test split's folder alone.
  const bool test_only = !opt.table.empty() && !test_dir.empty();
  auto scan = [&](const std::string& d) { return std::make_shared<Files>(scan_folder(d, classes, opt.labels_optional)); };
  std::shared_ptr<Files> train = test_only ? nullptr : scan(train_dir);
  std::shared_ptr<Files> test = test_dir.empty() ? nullptr : scan(test_dir);
  if (test_only) train = test;
  SAT_CHECK(!opt.table.empty() || opt.evaluating || classes.size() >= 2, train_dir, ": ", classes.size(),
            " class folder (", names_list(classes), "); expected at least 2 classes");
  BadFiles bad;
  check_files(*train, bad);
  if (test && test != train) check_files(*test, bad);
  SAT_CHECK(bad.count == 0 || opt.skip_bad_images, bad.first, " (", bad.count, " bad image file", bad.count == 1 ? "" : "s",
            " under ", dir, test_dir.empty() || split ? "" : " and " + test_dir, "; --skip-bad-images leaves them out)");
  for (const auto& f : {train, test})
    SAT_CHECK(!f || !f->paths.empty(), f->root, ": every image is bad (", bad.first, "); expected images to read");
  setup->classes = classes.empty() ? opt.num_classes : int64_t(classes.size());
  setup->names = classes;
  if (!classes.empty()) {
    ImageSchema s{classes, {chw[0], chw[1], chw[2]}, scaled.mean, scaled.std};
    setup->schema = s.to_json();
  }
  // The splits.
  std::vector<int64_t> train_rows, test_rows;
  std::string how = test ? test->root : "";
  if (opt.val_fraction > 0) {
    std::tie(train_rows, test_rows) = hold_out(int64_t(train->paths.size()), opt.val_fraction, opt.seed,
                                               "images of " + train_dir);
    test = train;
    how = str_cat("--val-fraction ", opt.val_fraction, ", seed ", opt.seed);
  } else if (!test && (opt.evaluating || !opt.table.empty())) {
    test = train;
    how = "all of " + train_dir;
  }
  DataSplit d;
  d.train = std::make_unique<ImageFolderDataset>("images train", train, std::move(train_rows), setup);
  if (test) d.test = std::make_unique<ImageFolderDataset>("images test", test, std::move(test_rows), setup);
  d.description = describe(dir, d, test_only, how, classes, *setup, bad);
  return d;
}

}  // namespace sat::data_detail
