// Tables as training data (--data csv:FILE, data/csv.h): the RFC 4180 reader (quotes,
// CRLF, blank lines), classes in sorted order (integers numerically, strings bytewise),
// the standardisation and the --val-fraction split, the one-line errors, and the CLI end to
// end: an mlp trained on a generated three-class table, predict writing the labels' own
// names, and 2-rank data parallelism following one process.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/csv.h"
#include "data/dataset.h"
#include "error_of.h"
#include "run_command.h"

#ifndef SAT_MPIEXEC
#define SAT_MPIEXEC "mpirun --oversubscribe"
#endif

namespace fs = std::filesystem;
using sat::test::error_of;

namespace {

class Csv : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / sat::str_cat("sat_test_csv_", getpid(), "_", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  fs::path dir_;
};

std::vector<std::vector<std::string>> records(const std::string& path, std::vector<int64_t>* lines = nullptr) {
  sat::CsvReader r(path);
  std::vector<std::vector<std::string>> out;
  std::vector<std::string> f;
  while (r.next(f)) {
    out.push_back(f);
    if (lines) lines->push_back(r.line());
  }
  return out;
}

sat::DataSplit open(const std::string& spec, const std::string& label, double val_fraction = 0,
                    const std::string& table = "", bool labels_optional = false) {
  sat::DataOptions o;
  o.label = label;
  o.val_fraction = val_fraction;
  o.table = table;
  o.labels_optional = labels_optional;
  return sat::open_dataset(spec, o);
}

// Every sample of d: features and labels.
void read_all(const sat::Dataset& d, std::vector<std::vector<float>>& x, std::vector<int32_t>& y) {
  const size_t F = size_t(d.sample_shape().numel());
  x.assign(size_t(d.size()), std::vector<float>(F));
  y.assign(size_t(d.size()), 0);
  for (int64_t i = 0; i < d.size(); ++i) d.get(i, x[size_t(i)].data(), &y[size_t(i)]);
}

}  // namespace

// ---------------------------------------------------------------- the reader

TEST_F(Csv, QuotedFieldsCrlfAndBlankLines) {
  const std::string p = write("q.csv", "\xEF\xBB\xBF" "a,\"b,c\",d\r\n"
                                       "1,\"say \"\"hi\"\"\",\"two\nlines\"\r\n"
                                       "\r\n"
                                       "2,,\"\"\r\n"
                                       "3,x,y\n\n\n");
  std::vector<int64_t> lines;
  const auto r = records(p, &lines);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0], (std::vector<std::string>{"a", "b,c", "d"}));  // the byte order mark is skipped
  EXPECT_EQ(r[1], (std::vector<std::string>{"1", "say \"hi\"", "two\nlines"}));
  EXPECT_EQ(r[2], (std::vector<std::string>{"2", "", ""}));
  EXPECT_EQ(r[3], (std::vector<std::string>{"3", "x", "y"}));
  EXPECT_EQ(lines, (std::vector<int64_t>{1, 2, 5, 6}));  // a quoted line break counts; blank lines are skipped
  // No line feed at the end, a trailing empty field, a quoted field at the very end.
  EXPECT_EQ(records(write("e.csv", "a,b\n1,")), (std::vector<std::vector<std::string>>{{"a", "b"}, {"1", ""}}));
  EXPECT_EQ(records(write("f.csv", "a,b\n1,\"2\"")), (std::vector<std::vector<std::string>>{{"a", "b"}, {"1", "2"}}));
  EXPECT_TRUE(records(write("empty.csv", "")).empty());
}

TEST_F(Csv, GzipIsReadToo) {
  const std::string p = (dir_ / "t.csv.gz").string();
  gzFile f = gzopen(p.c_str(), "wb");
  const std::string text = "x,y\n1,a\n2,b\n";
  gzwrite(f, text.data(), unsigned(text.size()));
  gzclose(f);
  EXPECT_EQ(records(p).size(), 3u);
}

TEST_F(Csv, MalformedQuotesNameTheLine) {
  EXPECT_EQ(error_of([&] { records(write("a.csv", "a,b\n1,x\"y\n")); }),
            (dir_ / "a.csv").string() + ":2: a quote inside an unquoted field; expected a field that holds quotes to be "
            "quoted, with its quotes doubled (\"say \"\"hi\"\"\")");
  EXPECT_NE(error_of([&] { records(write("b.csv", "a,b\n1,\"x\"y\n")); })
                .find("b.csv:2: 'y' after the closing quote of a field; expected a comma or the end of the line"),
            std::string::npos);
  EXPECT_NE(error_of([&] { records(write("c.csv", "a,b\n1,2\n3,\"open\n\n")); })
                .find("c.csv:3: a quoted field opened on this line is still open at the end of the file"),
            std::string::npos);
}

// ---------------------------------------------------------------- classes and values

TEST_F(Csv, StringLabelsAreClassesInSortedOrder) {
  const std::string p = write("s.csv", "f1,kind,f2\n1,virginica,2\n2,setosa,3\n3,versicolor,4\n4,setosa,5\n");
  sat::DataSplit d = open("csv:" + p, "kind");
  EXPECT_EQ(d.train->class_names(), (std::vector<std::string>{"setosa", "versicolor", "virginica"}));
  EXPECT_EQ(d.train->num_classes(), 3);
  EXPECT_EQ(d.train->sample_shape(), sat::Shape({1, 1, 2}));
  EXPECT_EQ(d.test, nullptr);  // one file, no --val-fraction: no test split
  std::vector<std::vector<float>> x;
  std::vector<int32_t> y;
  read_all(*d.train, x, y);
  EXPECT_EQ(y, (std::vector<int32_t>{2, 0, 1, 0}));
  // Standardised with the rows' mean and population std: f1 = 1..4 has mean 2.5, std sqrt(1.25).
  EXPECT_FLOAT_EQ(x[0][0], float((1 - 2.5) / std::sqrt(1.25)));
  EXPECT_FLOAT_EQ(x[3][1], float((5 - 3.5) / std::sqrt(1.25)));
  const auto s = sat::TableSchema::from_json(d.train->schema(), "test");
  EXPECT_EQ(s.label, "kind");
  EXPECT_EQ(s.features, (std::vector<std::string>{"f1", "f2"}));
  EXPECT_FALSE(s.integer_labels);
  EXPECT_FLOAT_EQ(s.mean[0], 2.5f);
}

TEST_F(Csv, IntegerLabelsAreOrderedNumerically) {
  const std::string p = write("i.csv", "x,y\n0.5,10\n1.5,9\n2.5,-1\n3.5,2\n4.5,09\n");
  sat::DataSplit d = open("csv:" + p, "y");
  EXPECT_EQ(d.train->class_names(), (std::vector<std::string>{"-1", "2", "9", "10"}));  // "09" is 9
  std::vector<std::vector<float>> x;
  std::vector<int32_t> y;
  read_all(*d.train, x, y);
  EXPECT_EQ(y, (std::vector<int32_t>{3, 2, 0, 1, 2}));
  // One label that is not an integer makes them all strings, ordered bytewise.
  const std::string q = write("m.csv", "x,y\n1,10\n2,9\n3,b\n4,a\n");
  EXPECT_EQ(open("csv:" + q, "y").train->class_names(), (std::vector<std::string>{"10", "9", "a", "b"}));
  // A constant feature keeps std 1.
  const std::string c = write("c.csv", "x,k,y\n1,7,a\n2,7,b\n");
  read_all(*open("csv:" + c, "y").train, x, y);
  EXPECT_EQ(x[0][1], 0.0f);
}

TEST_F(Csv, ValFractionHoldsOutSeededRowsAndTrainsStatisticsOnTheRest) {
  std::ostringstream t;
  t << "v,c\n";
  for (int i = 0; i < 50; ++i) t << i << "," << (i % 2 ? "odd" : "even") << "\n";
  const std::string p = write("v.csv", t.str());
  sat::DataOptions o;
  o.label = "c";
  o.val_fraction = 0.2;
  o.seed = 3;
  sat::DataSplit d = sat::open_dataset("csv:" + p, o);
  ASSERT_NE(d.test, nullptr);
  EXPECT_EQ(d.train->size(), 40);
  EXPECT_EQ(d.test->size(), 10);
  const auto s = sat::TableSchema::from_json(d.train->schema(), "test");
  // The rows back from the standardised values: the splits cover every row once.
  std::vector<std::vector<float>> x;
  std::vector<int32_t> y;
  std::set<long> rows, held;
  double sum = 0;
  read_all(*d.train, x, y);
  for (auto& r : x) rows.insert(std::lround(r[0] * s.std[0] + s.mean[0])), sum += r[0];
  EXPECT_NEAR(sum, 0.0, 1e-4);  // the mean is the training rows'
  read_all(*d.test, x, y);
  for (auto& r : x) held.insert(std::lround(r[0] * s.std[0] + s.mean[0]));
  EXPECT_EQ(rows.size(), 40u);
  EXPECT_EQ(held.size(), 10u);
  for (long r : held) EXPECT_EQ(rows.count(r), 0u);
  // The same seed holds out the same rows; another seed others.
  sat::DataSplit again = sat::open_dataset("csv:" + p, o);
  std::vector<std::vector<float>> x2;
  read_all(*again.test, x2, y);
  EXPECT_EQ(x, x2);
  o.seed = 4;
  read_all(*sat::open_dataset("csv:" + p, o).test, x2, y);
  EXPECT_NE(x, x2);
}

TEST_F(Csv, ValFileUsesTheTrainingClassesAndStatistics) {
  const std::string tr = write("tr.csv", "a,b,y\n0,10,cat\n2,30,dog\n");
  const std::string va = write("va.csv", "y,b,a\ndog,20,1\n");  // columns in another order
  sat::DataSplit d = open("csv:" + tr + ":" + va, "y");
  ASSERT_NE(d.test, nullptr);
  std::vector<std::vector<float>> x;
  std::vector<int32_t> y;
  read_all(*d.test, x, y);
  EXPECT_EQ(y, (std::vector<int32_t>{1}));
  EXPECT_EQ(x[0], (std::vector<float>{0.0f, 0.0f}));  // (1 - 1) / 1 and (20 - 20) / 10
  const std::string bad = write("bad.csv", "a,b,y\n1,2,bird\n");
  EXPECT_NE(error_of([&] { open("csv:" + tr + ":" + bad, "y"); })
                .find("bad.csv:2: label 'bird' (column 'y') is not one of the 2 classes of the training data (cat, dog)"),
            std::string::npos);
}

// eval and predict: the schema saved with the weights reads a file without labels.
TEST_F(Csv, SavedSchemaReadsFilesWithoutTheLabel) {
  const std::string tr = write("tr.csv", "a,b,y\n0,10,2\n2,30,7\n4,50,2\n");
  const std::string schema = open("csv:" + tr, "y").train->schema();
  const std::string nolabel = write("new.csv", "b,a\n30,2\n");
  sat::DataSplit d = open("csv:" + nolabel, "", 0, schema, true);
  ASSERT_NE(d.test, nullptr);  // the whole file is the split evaluated
  EXPECT_EQ(d.test->size(), 1);
  EXPECT_EQ(d.test->class_names(), (std::vector<std::string>{"2", "7"}));
  std::vector<std::vector<float>> x;
  std::vector<int32_t> y;
  read_all(*d.test, x, y);
  EXPECT_EQ(y, (std::vector<int32_t>{-1}));
  EXPECT_FLOAT_EQ(x[0][0], float((2 - 2) / std::sqrt(8.0 / 3)));
  // eval needs the labels; an integer label is matched by value.
  EXPECT_NE(error_of([&] { open("csv:" + nolabel, "", 0, schema, false); }).find("has no column 'y'"),
            std::string::npos);
  read_all(*open("csv:" + write("l.csv", "a,b,y\n1,1,07\n"), "", 0, schema).test, x, y);
  EXPECT_EQ(y, (std::vector<int32_t>{1}));
  EXPECT_NE(error_of([&] { open("csv:" + write("x.csv", "a,b,c\n1,1,1\n"), "", 0, schema, true); })
                .find("x.csv: column 'c' is not one of the training data's; expected its features a, b and its label y"),
            std::string::npos);
  EXPECT_NE(error_of([&] { open("csv:" + write("m.csv", "a\n1\n"), "", 0, schema, true); })
                .find("m.csv: has no column 'b', a feature of the training data"),
            std::string::npos);
  EXPECT_NE(error_of([&] { open("csv:" + nolabel, "z", 0, schema, true); })
                .find("--label z: the weights were trained with --label y"),
            std::string::npos);
}

// ---------------------------------------------------------------- errors

TEST_F(Csv, BadTablesAreOneLineErrors) {
  const std::string ragged = write("ragged.csv", "a,b,y\n1,2,p\n3,q\n");
  EXPECT_EQ(error_of([&] { open("csv:" + ragged, "y"); }), ragged + ":3: 2 columns, expected 3 as in the header");
  const std::string word = write("word.csv", "a,b,y\n1,2,p\n3,four,q\n");
  EXPECT_EQ(error_of([&] { open("csv:" + word, "y"); }),
            word + ":3: column 'b' is 'four', not a number; expected numbers in every column but the label y");
  const std::string gap = write("gap.csv", "a,b,y\n1,,p\n");
  EXPECT_NE(error_of([&] { open("csv:" + gap, "y"); }).find(":2: column 'b' is empty, not a number"), std::string::npos);
  EXPECT_NE(error_of([&] { open("csv:" + write("inf.csv", "a,y\n1e39,p\n"), "y"); })
                .find(":2: column 'a' is '1e39'; expected a finite number within float32's range"),
            std::string::npos);
  const std::string ok = write("ok.csv", "sepal,petal,species\n1,2,a\n3,4,b\n");
  EXPECT_EQ(error_of([&] { open("csv:" + ok, "kind"); }),
            "--label kind: " + ok + " has no column 'kind'; its columns: sepal, petal, species");
  EXPECT_EQ(error_of([&] { open("csv:" + ok, ""); }),
            "--data csv:" + ok + " needs --label NAME, the column of class labels (its columns: sepal, petal, species)");
  const std::string empty = write("empty.csv", "");
  EXPECT_EQ(error_of([&] { open("csv:" + empty, "y"); }),
            empty + ": empty; expected a header row (the column names), then one row per sample");
  const std::string header = write("header.csv", "a,b,y\r\n\r\n");
  EXPECT_EQ(error_of([&] { open("csv:" + header, "y"); }),
            header + ": has a header but no rows; expected one row per sample after it");
  const std::string dup = write("dup.csv", "a,b,a,y\n1,2,3,p\n");
  EXPECT_EQ(error_of([&] { open("csv:" + dup, "y"); }),
            dup + ":1: the header names column 'a' twice (columns 1 and 3); expected unique column names");
  EXPECT_NE(error_of([&] { open("csv:" + write("noname.csv", ",a,y\n0,1,p\n"), "y"); })
                .find(":1: column 1 of the header has no name"),
            std::string::npos);
  EXPECT_NE(error_of([&] { open("csv:" + write("one.csv", "a,y\n1,p\n2,p\n"), "y"); })
                .find("--label y: every row of "),
            std::string::npos);
  EXPECT_NE(error_of([&] { open("csv:" + write("only.csv", "y\np\nq\n"), "y"); }).find("has no column but the label"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { open("csv:" + ok, "species", 1.5); }),
            "--val-fraction 1.5: expected a fraction of the rows between 0 and 1, such as 0.2");
  EXPECT_NE(error_of([&] { open("csv:" + ok, "species", 0.9); }).find("leaves none to train on"), std::string::npos);
  EXPECT_NE(error_of([&] { open("csv:" + ok + ":" + ok, "species", 0.5); }).find("--val-fraction: not with --data csv:"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { open("synthetic", "species"); }),
            "--label applies to tables only (--data csv:FILE), not --data synthetic");
  EXPECT_EQ(error_of([&] { open("csv:", "y"); }), "--data csv:: expected csv:FILE or csv:TRAIN_FILE:VAL_FILE");
  EXPECT_NE(error_of([&] { open("csv:" + (dir_ / "none.csv").string(), "y"); }).find("none.csv"), std::string::npos);
}

// ---------------------------------------------------------------- the command

namespace {

using sat::test::CmdResult;

CmdResult saturate(const std::string& args, int np = 1) {
  std::string launcher;
  if (np > 1)
    launcher = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 300 " SAT_MPIEXEC " -np " +
               std::to_string(np) + " ";
  return sat::test::run_command("OMP_WAIT_POLICY=passive " + launcher + SAT_BINARY + " " + args);
}

const char* kSpecies[] = {"setosa", "versicolor", "virginica"};

// An iris-like table: n rows of 4 measurements around each species' means (Fisher's iris
// statistics), species in random order; `with_label`: the species column last.
std::string iris_like(int n, unsigned seed, bool with_label, std::vector<int>* truth = nullptr) {
  const double mean[3][4] = {{5.0, 3.4, 1.5, 0.25}, {5.9, 2.8, 4.3, 1.3}, {6.6, 3.0, 5.6, 2.0}};
  const double sd[3][4] = {{0.35, 0.38, 0.17, 0.1}, {0.52, 0.31, 0.47, 0.2}, {0.64, 0.32, 0.55, 0.27}};
  std::mt19937 rng(seed);
  std::normal_distribution<double> z(0, 1);
  std::ostringstream s;
  s << "sepal_length,sepal_width,petal_length,petal_width" << (with_label ? ",species" : "") << "\n";
  for (int i = 0; i < n; ++i) {
    const int c = int(rng() % 3);
    if (truth) truth->push_back(c);
    for (int f = 0; f < 4; ++f) s << (f ? "," : "") << std::round((mean[c][f] + sd[c][f] * z(rng)) * 100) / 100;
    if (with_label) s << "," << kSpecies[c];
    s << "\n";
  }
  return s.str();
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

// The rows of predict's CSV, after its header.
std::vector<std::vector<std::string>> predictions(const fs::path& p) {
  auto r = records(p.string());
  EXPECT_FALSE(r.empty());
  if (!r.empty()) {
    EXPECT_EQ(r[0], (std::vector<std::string>{"index", "class", "probability", "label"}));
    r.erase(r.begin());
  }
  return r;
}

}  // namespace

// The mlp learns a three-class table; predict writes the species' names, with or without
// the label column, from weights and from a checkpoint.
TEST_F(Csv, CliTrainsAnMlpAndPredictsTheLabelsNames) {
  const std::string train = write("iris.csv", iris_like(150, 1, true));
  const fs::path run = dir_ / "run";
  const std::string common = "--model mlp:4-16-3 --data csv:" + train + " --label species --val-fraction 0.2 --seed 5";
  CmdResult r = saturate("train " + common + " --batch 8 --epochs 30 --lr 0.01 --threads 1 --out " + run.string() +
                         " --save-weights " + (dir_ / "w.safetensors").string() + " --checkpoint-dir " +
                         (dir_ / "ckpt").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("120 train rows, 30 test rows"), std::string::npos) << r.out;
  const double accuracy = read_json(run / "summary.json")["test_accuracy"].get<double>();
  std::printf("test accuracy of mlp:4-16-3 on the iris-like table: %.4f\n", accuracy);
  EXPECT_GE(accuracy, 0.9);
  const auto table = read_json(run / "table.json");
  EXPECT_EQ(table["classes"], (std::vector<std::string>{"setosa", "versicolor", "virginica"}));
  EXPECT_EQ(table["label"], "species");
  EXPECT_EQ(table["mean"].size(), 4u);

  // eval with train's flags gives train's figure.
  r = saturate("eval " + common + " --batch 8 --threads 1 --init-weights " + (dir_ / "w.safetensors").string());
  ASSERT_EQ(r.status, 0) << r.out;
  char want[64];
  std::snprintf(want, sizeof want, "test accuracy %.2f%%", 100 * accuracy);
  EXPECT_NE(r.out.find(want), std::string::npos) << r.out;

  // New rows without the label: the names of the classes, mostly right.
  std::vector<int> truth;
  const std::string fresh = write("new.csv", iris_like(60, 2, false, &truth));
  for (const std::string weights : {"w.safetensors", "ckpt"}) {
    const fs::path out = dir_ / ("pred-" + weights + ".csv");
    r = saturate("predict --model mlp:4-16-3 --data csv:" + fresh + " --init-weights " + (dir_ / weights).string() +
                 " --out " + out.string());
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(r.out.find("accuracy"), std::string::npos) << r.out;  // no labels, no accuracy
    const auto rows = predictions(out);
    ASSERT_EQ(rows.size(), 60u);
    int right = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(rows[i][0], std::to_string(i));
      EXPECT_TRUE(rows[i][1] == "setosa" || rows[i][1] == "versicolor" || rows[i][1] == "virginica") << rows[i][1];
      EXPECT_EQ(rows[i][3], "");
      right += rows[i][1] == kSpecies[truth[i]];
    }
    std::printf("predict (%s) on 60 new rows: %d right\n", weights.c_str(), right);
    EXPECT_GE(right, 54);
  }
  // With the label column: the labels' names beside, and the accuracy.
  const std::string labelled = write("labelled.csv", iris_like(60, 2, true));
  r = saturate("predict --model mlp:4-16-3 --data csv:" + labelled + " --init-weights " +
               (dir_ / "w.safetensors").string() + " --out " + (dir_ / "pl.csv").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("accuracy "), std::string::npos) << r.out;
  const auto rows = predictions(dir_ / "pl.csv");
  ASSERT_EQ(rows.size(), 60u);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i][3], kSpecies[truth[i]]);
}

TEST_F(Csv, CliNamesTheModelAndTheTablesCounts) {
  const std::string train = write("iris.csv", iris_like(30, 1, true));
  CmdResult r = saturate("train --model mlp:4-16-2 --data csv:" + train + " --label species --steps 1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--model mlp:4-16-2 takes 4 inputs and has 2 outputs, but the table (--data) has 4 features and "
                       "3 classes: use --model mlp:4-16-3"), std::string::npos) << r.out;
  r = saturate("train --model mlp --data csv:" + train + " --label species --steps 1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("use --model mlp:4-1024-1024-3"), std::string::npos) << r.out;
  r = saturate("train --model convnet --data csv:" + train + " --label species --steps 1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--model convnet takes images"), std::string::npos) << r.out;
  r = saturate("train --model mlp:4-16-3 --data csv:" + train + " --steps 1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("needs --label NAME"), std::string::npos) << r.out;
  r = saturate("train --model mlp --data synthetic --label species --steps 1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--label applies to tables only"), std::string::npos) << r.out;
  const std::string ragged = write("ragged.csv", "a,b,c,d,species\n1,2,3,4,x\n1,2,3,y\n");
  r = saturate("train --model mlp:4-16-2 --data csv:" + ragged + " --label species --steps 1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("saturate: error: " + ragged + ":3: 4 columns, expected 5 as in the header"), std::string::npos)
      << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;  // one line
}

// 2 ranks of 8 rows follow one process of 16 (the same global batch) within 1e-5.
TEST_F(Csv, CliDataParallelFollowsOneProcess) {
  if (sat::test::mpirun().empty()) GTEST_SKIP() << "no mpirun";
  const std::string train = write("iris.csv", iris_like(160, 3, true));
  const std::string flags = "train --model mlp:4-16-3 --data csv:" + train + " --label species --val-fraction 0.2 "
                            "--steps 12 --lr 0.01 --threads 1 --out ";
  CmdResult one = saturate(flags + (dir_ / "one").string() + " --batch 16");
  ASSERT_EQ(one.status, 0) << one.out;
  CmdResult two = saturate(flags + (dir_ / "two").string() + " --batch 8", 2);
  ASSERT_EQ(two.status, 0) << two.out;
  auto losses = [](const fs::path& p) {
    std::vector<double> v;
    std::ifstream f(p);
    for (std::string line; std::getline(f, line);) v.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    return v;
  };
  const auto a = losses(dir_ / "one" / "metrics.jsonl"), b = losses(dir_ / "two" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  std::printf("2 ranks against one process: largest loss difference %.3g over 12 steps\n", worst);
  EXPECT_LE(worst, 1e-5);
}

// Bad input under mpirun: every rank says so in one line, and the job exits with status 2.
TEST_F(Csv, CliBadTableFailsOnEveryRank) {
  if (sat::test::mpirun().empty()) GTEST_SKIP() << "no mpirun";
  const std::string word = write("word.csv", "a,species\n1,x\nfour,y\n");
  CmdResult r = saturate("train --model mlp:1-4-2 --data csv:" + word + " --label species --steps 1", 2);
  EXPECT_EQ(r.status, 2) << r.out;
  for (int rank : {0, 1})
    EXPECT_NE(r.out.find(sat::str_cat("error on rank ", rank, ": ", word, ":3: column 'a' is 'four', not a number")),
              std::string::npos) << r.out;
}
