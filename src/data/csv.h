// Tables as training data: --data csv:FILE[:VAL_FILE] with --label NAME.
//
// A table is a CSV file (RFC 4180: a header row, then one row per sample; fields separated
// by commas, a field in double quotes may hold commas, line breaks and doubled quotes "";
// lines end in LF or CRLF; blank lines are skipped; gzip or plain, read through zlib). The
// column --label names holds the class labels; every other column is a numeric feature,
// and a sample is the flat vector of its features in the header's order (shape {1, 1, F}:
// what an mlp:F-...-C flattens, and what a model file declares as its input [1, 1, F]).
//
// Classes: when every label is an integer they are ordered numerically, otherwise as
// strings (bytewise); class c is the c-th label in that order, and the number of classes is
// the number of distinct labels. Features are standardised with the training rows' mean and
// (population) standard deviation, x' = (x - mean) / std in float32 (a constant column
// keeps std 1), or with --normalize's fixed values. Everything a model trained on a table
// needs to read other tables like it (the label column, the features, the classes, the
// standardisation) is its TableSchema, which train saves with the weights, the checkpoints
// and the --out directory (table.json), so that eval and predict read new files, with or
// without the label column, the same way and predict writes the labels' own names.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

struct gzFile_s;

namespace sat {

// What a model trained on a table reads other tables with.
struct TableSchema {
  std::string label;                  // the class column's name
  std::vector<std::string> features;  // the feature columns, in the model's input order
  std::vector<std::string> classes;   // class c's label (integers in decimal)
  bool integer_labels = false;        // the classes are integers, ordered numerically
  std::vector<float> mean, std;       // one per feature: x' = (x - mean) / std

  // JSON: {"format", "label", "label_type": "integer"|"string", "classes", "features",
  // "mean", "std"}; from_json checks every key and count (sat::Error naming `where`).
  std::string to_json() const;
  static TableSchema from_json(const std::string& text, const std::string& where);
};

// A strict RFC 4180 reader that streams a file (gzip or plain) record by record. Every
// malformed record is a sat::Error naming the file and the line: a quote inside an unquoted
// field, a character after a closing quote other than a comma or the line's end, a quoted
// field still open at the end of the file. A UTF-8 byte order mark before the header is
// skipped.
class CsvReader {
 public:
  explicit CsvReader(std::string path);  // opened as core/io.h's InputFile (sat::Error naming --data)
  ~CsvReader();
  CsvReader(const CsvReader&) = delete;
  CsvReader& operator=(const CsvReader&) = delete;

  // The next record's fields (quotes removed, "" unescaped, a CR before the line feed
  // dropped); false at the end of the file. Blank lines are skipped.
  bool next(std::vector<std::string>& fields);
  int64_t line() const { return record_line_; }  // the line (from 1) the last record starts on
  const std::string& path() const { return path_; }

 private:
  int get();  // the next byte, or -1 at the end
  void refill();
  bool read_field(std::string& field, int& c);  // c: the field's first byte; then the byte after it
  std::string path_;
  gzFile_s* f_ = nullptr;
  std::vector<char> buf_;
  size_t pos_ = 0, end_ = 0;
  bool eof_ = false;
  int64_t line_ = 1, record_line_ = 0;
};

namespace data_detail {

// --data csv:TRAIN_FILE[:VAL_FILE] with opt.label, opt.val_fraction, opt.mean/std
// (--normalize) and, in eval and predict, opt.table (the schema saved with the weights).
DataSplit open_csv(const std::string& train_file, const std::string& val_file, const DataOptions& opt);

}  // namespace data_detail
}  // namespace sat
