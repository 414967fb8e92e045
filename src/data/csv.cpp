// Tables (csv.h): the RFC 4180 reader, the schema, and --data csv:FILE[:VAL_FILE].
#include "data/csv.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/io.h"
#include "core/text.h"
#include "data/gz_open.h"
#include "data/sources.h"
#include "core/rng.h"

namespace sat {

// ---------------------------------------------------------------- the reader

CsvReader::CsvReader(std::string path) : path_(std::move(path)), buf_(size_t(1) << 20) {
  f_ = gz_open_data(path_);
  try {
    refill();
  } catch (...) {  // the destructor of an object not yet constructed does not run
    gzclose(f_);
    throw;
  }
  if (end_ >= 3 && uint8_t(buf_[0]) == 0xEF && uint8_t(buf_[1]) == 0xBB && uint8_t(buf_[2]) == 0xBF) pos_ = 3;
}

CsvReader::~CsvReader() {
  if (f_) gzclose(f_);
}

void CsvReader::refill() {
  pos_ = end_ = 0;
  if (eof_) return;
  const int r = gzread(f_, buf_.data(), unsigned(buf_.size()));
  int errnum = Z_OK;
  std::string msg = r <= 0 ? gzerror(f_, &errnum) : "";
  if (r < 0 || (r == 0 && errnum != Z_OK)) {
    if (msg.rfind(path_ + ": ", 0) == 0) msg.erase(0, path_.size() + 2);
    fail(path_, ": read error near line ", line_, ": ", msg,
         errnum == Z_BUF_ERROR ? " (the gzip stream is truncated)" : " (corrupt gzip data?)");
  }
  eof_ = r == 0;
  end_ = size_t(r);
}

int CsvReader::get() {
  if (pos_ == end_) {
    refill();
    if (end_ == 0) return -1;
  }
  return uint8_t(buf_[pos_++]);
}

bool CsvReader::read_field(std::string& field, int& c) {
  field.clear();
  if (c != '"') {
    while (c >= 0 && c != ',' && c != '\n') {
      SAT_CHECK(c != '"', path_, ":", line_, ": a quote inside an unquoted field; expected a field that holds quotes "
                "to be quoted, with its quotes doubled (\"say \"\"hi\"\"\")");
      field += char(c);
      c = get();
    }
    if (!field.empty() && field.back() == '\r') field.pop_back();  // CRLF
    return false;
  }
  const int64_t opened = line_;
  for (;;) {
    c = get();
    SAT_CHECK(c >= 0, path_, ":", opened, ": a quoted field opened on this line is still open at the end of the file; "
              "expected a closing quote");
    if (c == '"') {
      c = get();
      if (c != '"') break;  // the closing quote; "" is a quote
    } else if (c == '\n') {
      ++line_;
    }
    field += char(c);
  }
  if (c == '\r') {
    c = get();
    SAT_CHECK(c < 0 || c == '\n', path_, ":", line_, ": a carriage return after the closing quote of a field is not "
              "followed by a line feed; expected a comma or the end of the line");
  }
  SAT_CHECK(c < 0 || c == ',' || c == '\n', path_, ":", line_, ": '", std::string(1, char(c)), "' after the closing "
            "quote of a field; expected a comma or the end of the line (a quote inside a quoted field is written "
            "twice: \"\")");
  return true;
}

bool CsvReader::next(std::vector<std::string>& fields) {
  for (;;) {
    fields.clear();
    record_line_ = line_;
    int c = get();
    if (c < 0) return false;
    bool quoted = false;
    for (;;) {
      fields.emplace_back();
      quoted = read_field(fields.back(), c) || quoted;
      if (c == ',') {
        c = get();
        continue;
      }
      if (c == '\n') ++line_;
      break;
    }
    if (fields.size() > 1 || quoted || !fields[0].empty()) return true;  // else a blank line
  }
}

// ---------------------------------------------------------------- the schema

std::string TableSchema::to_json() const {
  nlohmann::ordered_json j;
  j["format"] = "saturate table 1";
  j["label"] = label;
  j["label_type"] = integer_labels ? "integer" : "string";
  j["classes"] = classes;
  j["features"] = features;
  j["mean"] = mean;
  j["std"] = std;
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

template <typename T>
std::vector<T> json_list(const nlohmann::json& j, const char* key, const std::string& where) {
  SAT_CHECK(j.contains(key) && j[key].is_array(), where, ": the table description has no list '", key, "'");
  std::vector<T> v;
  for (const auto& e : j[key]) {
    if constexpr (std::is_same_v<T, std::string>)
      SAT_CHECK(e.is_string(), where, ": the table description's '", key, "' holds a non-string");
    else
      SAT_CHECK(e.is_number(), where, ": the table description's '", key, "' holds a non-number");
    v.push_back(e.get<T>());
  }
  return v;
}

}  // namespace

TableSchema TableSchema::from_json(const std::string& text, const std::string& where) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  SAT_CHECK(j.is_object() && j.value("format", "") == "saturate table 1", where,
            ": the table description is not one saturate wrote (expected \"format\": \"saturate table 1\")");
  TableSchema s;
  SAT_CHECK(j.contains("label") && j["label"].is_string(), where, ": the table description has no 'label'");
  s.label = j["label"].get<std::string>();
  const std::string type = j.value("label_type", "");
  SAT_CHECK(type == "integer" || type == "string", where, ": the table description's label_type is '", type,
            "'; expected integer or string");
  s.integer_labels = type == "integer";
  s.classes = json_list<std::string>(j, "classes", where);
  s.features = json_list<std::string>(j, "features", where);
  s.mean = json_list<float>(j, "mean", where);
  s.std = json_list<float>(j, "std", where);
  const size_t F = s.features.size();
  SAT_CHECK(!s.classes.empty() && F > 0 && s.mean.size() == F && s.std.size() == F, where, ": the table description "
            "has ", s.classes.size(), " classes, ", F, " features, ", s.mean.size(), " means and ", s.std.size(),
            " stds; expected classes, features, and one mean and std per feature");
  for (size_t i = 0; i < F; ++i)
    SAT_CHECK(std::isfinite(s.mean[i]) && std::isfinite(s.std[i]) && s.std[i] > 0, where, ": the table description's "
              "feature '", s.features[i], "' has mean ", s.mean[i], " and std ", s.std[i], "; expected finite values, "
              "std > 0");
  return s;
}

namespace data_detail {
namespace {

// ---------------------------------------------------------------- reading rows

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

bool parse_integer(const std::string& text, int64_t& v) {
  const std::string t = trim(text);
  const size_t digits = t.find_first_not_of("+-") == 1 ? 1 : 0;
  if (t.size() <= digits || t.find_first_not_of("0123456789", digits) != std::string::npos) return false;
  errno = 0;
  v = std::strtoll(t.c_str(), nullptr, 10);
  return errno == 0;
}

// The file's columns as the model reads them.
struct Columns {
  std::vector<std::string> header;
  std::vector<int> feature_of;  // per column of the file: its feature's index, or -1
  int label = -1;               // the label's column, or -1 when the file has none
};

// The header row: every column named, once.
std::vector<std::string> read_header(CsvReader& r) {
  std::vector<std::string> h;
  SAT_CHECK(r.next(h), r.path(), ": empty; expected a header row (the column names), then one row per sample");
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < h.size(); ++i) {
    SAT_CHECK(!h[i].empty(), r.path(), ":", r.line(), ": column ", i + 1, " of the header has no name; expected a name "
              "for every column (a pandas index? write the file with index=False)");
    const auto [it, fresh] = seen.emplace(h[i], i);
    SAT_CHECK(fresh, r.path(), ":", r.line(), ": the header names column '", h[i], "' twice (columns ", it->second + 1,
              " and ", i + 1, "); expected unique column names");
  }
  return h;
}

// Training: the --label column, and every other column a feature.
Columns training_columns(const std::vector<std::string>& header, const std::string& label, const std::string& path) {
  SAT_CHECK(!label.empty(), "--data csv:", path, " needs --label NAME, the column of class labels (its columns: ",
            names_list(header), ")");
  Columns c{header, std::vector<int>(header.size(), -1), -1};
  int f = 0;
  for (size_t i = 0; i < header.size(); ++i) {
    if (header[i] == label) c.label = int(i);
    else c.feature_of[i] = f++;
  }
  SAT_CHECK(c.label >= 0, "--label ", label, ": ", path, " has no column '", label, "'; its columns: ", names_list(header));
  SAT_CHECK(f > 0, path, ": has no column but the label '", label, "'; expected numeric feature columns beside it");
  return c;
}

// Another file read as the training data was: the schema's features (in any order), and its
// label column (optional where labels_optional).
Columns schema_columns(const std::vector<std::string>& header, const TableSchema& s, const std::string& path,
                       bool labels_optional) {
  Columns c{header, std::vector<int>(header.size(), -1), -1};
  std::map<std::string, int> feature;
  for (size_t f = 0; f < s.features.size(); ++f) feature[s.features[f]] = int(f);
  std::vector<bool> found(s.features.size(), false);
  for (size_t i = 0; i < header.size(); ++i) {
    if (header[i] == s.label) {
      c.label = int(i);
      continue;
    }
    const auto it = feature.find(header[i]);
    SAT_CHECK(it != feature.end(), path, ": column '", header[i], "' is not one of the training data's; expected its ",
              "features ", names_list(s.features), " and its label ", s.label);
    c.feature_of[i] = it->second;
    found[size_t(it->second)] = true;
  }
  for (size_t f = 0; f < found.size(); ++f)
    SAT_CHECK(found[f], path, ": has no column '", s.features[f], "', a feature of the training data; expected the "
              "features ", names_list(s.features), labels_optional ? " (and optionally the label " : " and the label ",
              s.label, labels_optional ? ")" : "");
  SAT_CHECK(c.label >= 0 || labels_optional, "--label ", s.label, ": ", path, " has no column '", s.label,
            "'; its columns: ", names_list(header));
  return c;
}

// A file's rows: features row-major, and each row's label as a class (a schema's), as the
// index of its first appearance (training: `seen` holds them), or -1 (no label column).
struct Rows {
  std::vector<float> x;
  std::vector<int32_t> y;
  std::vector<std::string> seen;
  int64_t n = 0;
  size_t features = 0;
};

// The classes of a schema by label, integers by their decimal form.
struct LabelMap {
  const TableSchema* schema = nullptr;  // null: training, labels collected in Rows::seen
  std::unordered_map<std::string, int32_t> index;
};

float feature_value(const CsvReader& r, const std::string& text, const std::string& column, const std::string& label) {
  const std::string t = trim(text);
  char* end = nullptr;
  errno = 0;
  const double v = t.empty() ? 0 : std::strtod(t.c_str(), &end);
  SAT_CHECK(!t.empty() && end == t.c_str() + t.size(), r.path(), ":", r.line(), ": column '", column, "' is ",
            t.empty() ? std::string("empty") : "'" + text + "'", ", not a number; expected numbers in every column but the label ",
            label);
  SAT_CHECK(std::isfinite(v) && std::isfinite(float(v)), r.path(), ":", r.line(), ": column '", column, "' is '", text,
            "'; expected a finite number within float32's range");
  return float(v);
}

int32_t label_value(const CsvReader& r, const std::string& text, const std::string& column, LabelMap& m, Rows& rows) {
  SAT_CHECK(!text.empty(), r.path(), ":", r.line(), ": the label column '", column, "' is empty; expected a class "
            "label on every row");
  if (!m.schema) {  // training: the labels as they come, ordered later
    const auto [it, fresh] = m.index.emplace(text, int32_t(rows.seen.size()));
    if (fresh) rows.seen.push_back(text);
    return it->second;
  }
  int64_t v = 0;
  const std::string key = m.schema->integer_labels && parse_integer(text, v) ? std::to_string(v) : text;
  const auto it = m.index.find(key);
  SAT_CHECK(it != m.index.end(), r.path(), ":", r.line(), ": label '", text, "' (column '", column, "') is not one of ",
            "the ", m.schema->classes.size(), " classes of the training data (", names_list(m.schema->classes), ")");
  return it->second;
}

Rows read_rows(CsvReader& r, const Columns& c, size_t features, LabelMap& labels, const std::string& label_name) {
  Rows rows;
  rows.features = features;
  std::vector<std::string> f;
  std::vector<float> x(features);
  while (r.next(f)) {
    SAT_CHECK(f.size() == c.header.size(), r.path(), ":", r.line(), ": ", f.size(), " column", f.size() == 1 ? "" : "s",
              ", expected ", c.header.size(), " as in the header");
    for (size_t i = 0; i < f.size(); ++i)
      if (c.feature_of[i] >= 0) x[size_t(c.feature_of[i])] = feature_value(r, f[i], c.header[i], label_name);
    rows.x.insert(rows.x.end(), x.begin(), x.end());
    rows.y.push_back(c.label >= 0 ? label_value(r, f[size_t(c.label)], c.header[size_t(c.label)], labels, rows) : -1);
    ++rows.n;
  }
  SAT_CHECK(rows.n > 0, r.path(), ": has a header but no rows; expected one row per sample after it");
  return rows;
}

// Reads a file against a schema (a validation file, or eval's and predict's data).
Rows read_with_schema(const std::string& path, const TableSchema& s, bool labels_optional) {
  CsvReader r(path);
  const Columns c = schema_columns(read_header(r), s, path, labels_optional);
  LabelMap m{&s, {}};
  for (size_t k = 0; k < s.classes.size(); ++k) m.index[s.classes[k]] = int32_t(k);
  return read_rows(r, c, s.features.size(), m, s.label);
}

// Training: the classes are the labels in order (numerically when all are integers), and
// each row's first-appearance index becomes its class.
void order_classes(Rows& rows, TableSchema& s, const std::string& path) {
  std::vector<int64_t> value(rows.seen.size());
  bool integers = true;
  for (size_t i = 0; i < rows.seen.size() && integers; ++i) integers = parse_integer(rows.seen[i], value[i]);
  std::vector<int32_t> cls(rows.seen.size());
  if (integers) {
    std::map<int64_t, int32_t> order;
    for (int64_t v : value) order.emplace(v, 0);
    for (auto& [v, k] : order) k = int32_t(s.classes.size()), s.classes.push_back(std::to_string(v));
    for (size_t i = 0; i < value.size(); ++i) cls[i] = order[value[i]];
  } else {
    std::map<std::string, int32_t> order;
    for (const std::string& v : rows.seen) order.emplace(v, 0);
    for (auto& [v, k] : order) k = int32_t(s.classes.size()), s.classes.push_back(v);
    for (size_t i = 0; i < rows.seen.size(); ++i) cls[i] = order[rows.seen[i]];
  }
  s.integer_labels = integers;
  SAT_CHECK(s.classes.size() >= 2, "--label ", s.label, ": every row of ", path, " has the label '", s.classes[0],
            "'; expected at least 2 classes");
  for (int32_t& y : rows.y) y = cls[size_t(y)];
}

// The features' mean and (population) std over `rows` (empty: all), or --normalize's values.
void standardisation(const Rows& data, const std::vector<int64_t>& rows, const DataOptions& opt, TableSchema& s) {
  const size_t F = data.features;
  if (!opt.mean.empty()) {
    SAT_CHECK(opt.mean.size() == opt.std.size() && (opt.mean.size() == 1 || opt.mean.size() == F), "--normalize: got ",
              opt.mean.size(), " means and ", opt.std.size(), " stds but the table has ", F, " features; expected ",
              "one mean and std for all, or ", F, " means then ", F, " stds");
    s.mean.resize(F), s.std.resize(F);
    for (size_t f = 0; f < F; ++f) {
      const size_t k = opt.mean.size() == 1 ? 0 : f;
      s.mean[f] = opt.mean[k], s.std[f] = opt.std[k];
    }
    return;
  }
  const int64_t n = rows.empty() ? data.n : int64_t(rows.size());
  auto row = [&](int64_t i) { return data.x.data() + size_t(rows.empty() ? i : rows[size_t(i)]) * F; };
  std::vector<double> mean(F, 0), var(F, 0);
  for (int64_t i = 0; i < n; ++i)
    for (size_t f = 0; f < F; ++f) mean[f] += row(i)[f];
  for (double& m : mean) m /= double(n);
  for (int64_t i = 0; i < n; ++i)
    for (size_t f = 0; f < F; ++f) var[f] += (row(i)[f] - mean[f]) * (row(i)[f] - mean[f]);
  s.mean.resize(F), s.std.resize(F);
  for (size_t f = 0; f < F; ++f) {
    s.mean[f] = float(mean[f]);
    const float sd = float(std::sqrt(var[f] / double(n)));
    s.std[f] = sd > 0 && std::isfinite(sd) ? sd : 1.0f;  // a constant column stays centred, unscaled
  }
}

// x' = (x - mean) / std, in double rounded to float (values near float32's limits cannot
// overflow on the way).
void standardise(Rows& data, const TableSchema& s, const std::string& path) {
  const size_t F = data.features;
  for (size_t i = 0; i < data.x.size(); ++i) {
    const size_t f = i % F;
    const float v = float((double(data.x[i]) - double(s.mean[f])) / double(s.std[f]));
    SAT_CHECK(std::isfinite(v), path, ": column '", s.features[f], "' holds ", data.x[i], ", which standardised (mean ",
              s.mean[f], ", std ", s.std[f], ") is beyond float32's range; expected values of a smaller spread");
    data.x[i] = v;
  }
}

// ---------------------------------------------------------------- the dataset

// Some rows (all, or one split's) of a table held once for both splits.
class TableDataset : public Dataset {
 public:
  TableDataset(std::string name, std::shared_ptr<const Rows> data, std::vector<int64_t> rows,
               std::shared_ptr<const TableSchema> schema, std::string scaling)
      : name_(std::move(name)), data_(std::move(data)), rows_(std::move(rows)), schema_(std::move(schema)),
        scaling_(std::move(scaling)) {}
  int64_t size() const override { return rows_.empty() ? data_->n : int64_t(rows_.size()); }
  Shape sample_shape() const override { return Shape{1, 1, int64_t(data_->features)}; }
  DType sample_dtype() const override { return DType::f32; }
  Shape label_shape() const override { return Shape{}; }
  int64_t num_classes() const override { return int64_t(schema_->classes.size()); }
  void get(int64_t i, void* x, int32_t* y) const override {
    const size_t r = size_t(rows_.empty() ? i : rows_[size_t(i)]), F = data_->features;
    std::memcpy(x, data_->x.data() + r * F, F * sizeof(float));
    *y = data_->y[r];
  }
  std::string name() const override { return name_; }
  std::string scaling() const override { return scaling_; }
  size_t storage_bytes() const override {
    return size_t(size()) * (data_->features * sizeof(float) + sizeof(int32_t)) + rows_.size() * sizeof(int64_t);
  }
  std::vector<std::string> class_names() const override { return schema_->classes; }
  std::string schema() const override { return schema_->to_json(); }
  bool is_table() const override { return true; }

 private:
  std::string name_;
  std::shared_ptr<const Rows> data_;
  std::vector<int64_t> rows_;  // empty: all of data_'s
  std::shared_ptr<const TableSchema> schema_;
  std::string scaling_;
};

// The pieces of a split before they become datasets.
struct TableSplit {
  std::shared_ptr<const Rows> train, test;  // test may be train's rows
  std::vector<int64_t> train_rows, test_rows;
  std::string how;  // how the test split was made, for the description
};

DataSplit make_split(TableSplit t, const std::shared_ptr<const TableSchema>& s, const std::string& scaling,
                     const std::string& file) {
  DataSplit d;
  d.train = std::make_unique<TableDataset>("csv train", t.train, std::move(t.train_rows), s, scaling);
  if (t.test) d.test = std::make_unique<TableDataset>("csv test", t.test, std::move(t.test_rows), s, scaling);
  d.description = str_cat("csv (", file, "): ", d.train->size(), " train rows, ",
                          d.test ? str_cat(d.test->size(), " test rows (", t.how, ")") : std::string("no test split"),
                          ", ", s->features.size(), " features, ", s->classes.size(), " classes (",
                          names_list(s->classes), "), ", scaling);
  return d;
}

std::string training_scaling(const DataOptions& opt) {
  return opt.mean.empty() ? "features standardised by the training rows' mean and std"
                          : "features standardised by --normalize's mean and std";
}

// train and tune: the schema comes from the training rows.
DataSplit open_for_training(const std::string& file, const std::string& val_file, const DataOptions& opt) {
  CsvReader r(file);
  const Columns c = training_columns(read_header(r), opt.label, file);
  auto s = std::make_shared<TableSchema>();
  s->label = opt.label;
  for (size_t i = 0; i < c.header.size(); ++i)
    if (c.feature_of[i] >= 0) s->features.push_back(c.header[i]);
  LabelMap m;
  auto rows = std::make_shared<Rows>(read_rows(r, c, s->features.size(), m, opt.label));
  order_classes(*rows, *s, file);
  TableSplit t;
  if (opt.val_fraction > 0) {
    std::tie(t.train_rows, t.test_rows) = hold_out(rows->n, opt.val_fraction, opt.seed, "rows of " + file);
    t.how = str_cat("--val-fraction ", opt.val_fraction, ", seed ", opt.seed);
  }
  standardisation(*rows, t.train_rows, opt, *s);
  standardise(*rows, *s, file);
  t.train = rows;
  if (opt.val_fraction > 0) t.test = rows;
  if (!val_file.empty()) {
    auto val = std::make_shared<Rows>(read_with_schema(val_file, *s, false));
    standardise(*val, *s, val_file);
    t.test = val;
    t.how = val_file;
  }
  return make_split(std::move(t), s, training_scaling(opt), file);
}

// eval and predict: the schema saved with the weights reads the files.
DataSplit open_with_schema(const std::string& file, const std::string& val_file, const DataOptions& opt) {
  auto s = std::make_shared<TableSchema>(TableSchema::from_json(opt.table, "--init-weights"));
  SAT_CHECK(opt.label.empty() || opt.label == s->label, "--label ", opt.label, ": the weights were trained with --label ",
            s->label);
  if (!opt.mean.empty()) {
    TableSchema given = *s;
    Rows none;
    none.features = s->features.size();
    standardisation(none, {}, opt, given);
    SAT_CHECK(given.mean == s->mean && given.std == s->std, "--normalize: the weights were trained with other means "
              "and stds (their table description holds them); leave --normalize out");
  }
  TableSplit t;
  auto rows = std::make_shared<Rows>(read_with_schema(file, *s, opt.labels_optional));
  standardise(*rows, *s, file);
  t.train = t.test = rows;
  t.how = "all of " + file;
  if (opt.val_fraction > 0) {
    std::tie(t.train_rows, t.test_rows) = hold_out(rows->n, opt.val_fraction, opt.seed, "rows of " + file);
    t.how = str_cat("--val-fraction ", opt.val_fraction, ", seed ", opt.seed);
  } else if (!val_file.empty()) {
    auto val = std::make_shared<Rows>(read_with_schema(val_file, *s, opt.labels_optional));
    standardise(*val, *s, val_file);
    t.test = val;
    t.how = val_file;
  }
  return make_split(std::move(t), s, "features standardised as in training (the weights' table description)", file);
}

}  // namespace

std::pair<std::vector<int64_t>, std::vector<int64_t>> hold_out(int64_t n, double fraction, uint64_t seed,
                                                               const std::string& what) {
  const int64_t held = std::max<int64_t>(1, std::llround(fraction * double(n)));
  SAT_CHECK(held < n, "--val-fraction ", fraction, ": holding out ", held, " of the ", n, " ", what,
            " leaves none to train on; expected a smaller fraction or more of them");
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = i;
  Rng rng(mix_seed(seed, 0x7ab1e5ull));
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[size_t(i)], p[rng.below(uint64_t(i + 1))]);
  std::vector<int64_t> train(p.begin(), p.end() - held), test(p.end() - held, p.end());
  std::sort(train.begin(), train.end());
  std::sort(test.begin(), test.end());
  return {train, test};
}

DataSplit open_csv(const std::string& train_file, const std::string& val_file, const DataOptions& opt) {
  SAT_CHECK(opt.val_fraction == 0 || (opt.val_fraction > 0 && opt.val_fraction < 1), "--val-fraction ",
            opt.val_fraction, ": expected a fraction of the rows between 0 and 1, such as 0.2");
  SAT_CHECK(val_file.empty() || opt.val_fraction == 0, "--val-fraction: not with --data csv:", train_file, ":",
            val_file, " (its second file is the test split)");
  return opt.table.empty() ? open_for_training(train_file, val_file, opt)
                           : open_with_schema(train_file, val_file, opt);
}

}  // namespace data_detail
}  // namespace sat
