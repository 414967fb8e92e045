// Datasets: in-memory sources of (sample, label) pairs, opened from a `--data` spec.
//
// A Dataset is read-only after construction and get() and get_train() are const,
// thread-safe and reentrant: the BatchLoader (loader.h) calls them from several worker
// threads at once, for different samples.
//
//   kind      sample                    label                    num_classes()
//   images    {C,H,W} f32               {}  int32 class index    classes (10)
//   tables    {1,1,F} f32 (features)    {}  int32 class index    the labels' (csv.h)
//   folders   {C,H,W} f32 (the model's) {}  int32 class index    the class folders' (images.h)
//   tokens    {T} i32 (token ids)       {T} int32 next tokens    model vocabulary
//
// Real images are stored as uint8 (Fashion-MNIST train is 47 MB so) and converted on
// get(): x = pixel/255 in float32, exactly PyTorch's ToTensor(); with --normalize,
// x = (pixel/255 - mean[c]) / std[c] in float32, exactly ToTensor() then Normalize().
// Synthetic data is generated on the fly from (seed, index): nothing is stored.
//
// Host memory of a dataset is NOT allocated through sat::Buffer: the budget in
// core/alloc.h stands for the accelerator's memory and the data never lives there
// (only the loader's batch ring does, see loader.h). storage_bytes() reports it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace sat {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Shape sample_shape() const = 0;   // images {C,H,W}; tokens {T}
  virtual DType sample_dtype() const = 0;   // f32 for images, i32 for tokens
  virtual Shape label_shape() const = 0;    // {} for a class index; {T} for next tokens
  virtual int64_t num_classes() const = 0;  // classes, or vocabulary size for tokens
  // Writes sample i (sample_shape, sample_dtype, contiguous) to x and its label
  // (label_shape, int32) to y. 0 <= i < size(). Thread-safe.
  virtual void get(int64_t i, void* x, int32_t* y) const = 0;
  // Sample i as training epoch `epoch` reads it. Datasets with random augmentation draw
  // the transform from (their seed, epoch, i) alone, never from the rank or the thread
  // that reads it, so every layout sees the same augmented samples. Default: get().
  virtual void get_train(int64_t i, int64_t epoch, void* x, int32_t* y) const { (void)epoch, get(i, x, y); }
  virtual std::string name() const = 0;          // "fashion-mnist train", for messages
  // How image pixels become values ("pixels/255", or --normalize's "(pixels/255 - M)/S"); ""
  // for data that is not scaled (tokens, tensors given as they are).
  virtual std::string scaling() const { return ""; }
  virtual size_t storage_bytes() const { return 0; }  // host bytes held (0 = generated)
  // Host bytes one reading thread holds while it reads (a decoder's buffers, say), beyond
  // the sample it writes: the loader's plan counts this per worker (loader.h). Default 0.
  virtual size_t worker_scratch_bytes() const { return 0; }
  // Tables (csv.h) and image folders (images.h): class c's own name, for predict ({} for the
  // others); and the schema a model trained on this data reads other data with (JSON), saved
  // with its weights and checkpoints ("" for the others), and beside the run in --out as
  // schema_file().
  virtual std::vector<std::string> class_names() const { return {}; }
  virtual std::string schema() const { return ""; }
  virtual std::string schema_file() const { return "table.json"; }
  virtual bool is_table() const { return false; }  // samples are a table's rows of features
  // Image folders: sample i's file, relative to its folder, for predict ("" for the others).
  virtual std::string sample_name(int64_t i) const { return (void)i, ""; }

  bool is_tokens() const { return sample_dtype() == DType::i32; }
  size_t sample_bytes() const { return size_t(sample_shape().numel()) * dtype_size(sample_dtype()); }
  int64_t label_numel() const { return label_shape().numel(); }
};

// What open_dataset needs to know about the model and the run.
struct DataOptions {
  // The model's input. Images: shape and classes used by `synthetic`; tokens: the
  // sequence length T (samples are T tokens, labels the T next tokens) and the
  // vocabulary every token must fall in.
  bool model_takes_tokens = false;
  Shape image_shape{1, 28, 28};
  int64_t num_classes = 10;
  int64_t seq_len = 0;  // T; required when model_takes_tokens
  int64_t vocab = 0;    // required when model_takes_tokens

  // --normalize: empty = pixel/255. Otherwise one value for all channels or one per
  // channel (mean and std must have the same length, 1 or C). See parse_normalize.
  std::vector<float> mean, std;

  uint64_t seed = 0;  // synthetic data, --val-fraction's split and --augment depend on this

  // Tables (csv:, see csv.h) and image folders (images:, images.h). label: --label, the class
  // column. val_fraction: --val-fraction, the share of the rows (images) held out as the test
  // split (0: none). table: the schema saved with the weights (eval and predict; "" in train:
  // the training data makes it). labels_optional: predict reads tables without the label
  // column and folders of images without class folders too. evaluating: eval and predict,
  // where an image folder without a test split of its own is the test split whole.
  std::string label;
  double val_fraction = 0;
  std::string table;
  bool labels_optional = false;
  bool evaluating = false;

  // Image folders: --augment (off, standard, or crop,flip: images.h) and --skip-bad-images.
  std::string augment;
  bool skip_bad_images = false;
};

struct DataSplit {
  std::unique_ptr<Dataset> train;
  std::unique_ptr<Dataset> test;  // null when the format has no test split
  std::string description;        // one line for the log: source, sizes, shapes, scaling
};

// Opens a --data spec. Accepted forms:
//   fashion-mnist[:DIR]        IDX files (default DIR /usr/share/datasets/fashion-mnist,
//                              Debian package dataset-fashion-mnist)
//   mnist:DIR                  IDX files train-images-idx3-ubyte, train-labels-idx1-ubyte,
//                              t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each
//                              optionally .gz (gzip or plain, both read through zlib)
//   cifar10:DIR                CIFAR-10 binary: data_batch_1..5.bin, test_batch.bin
//                              (DIR or DIR/cifar-10-batches-bin); records of 1 label
//                              byte + 3072 pixel bytes, CHW
//   tokens:FILE[:VAL_FILE]     llm.c token shards (data/token_shards.h: a 256 int32
//                              header, then uint16 or uint32 tokens), memory-mapped. FILE
//                              and VAL_FILE may each be a glob (data/*.bin) or a directory
//                              (its *.bin): the shards in name order. Samples are
//                              non-overlapping windows within a shard: x = tok[iT, iT+T),
//                              y = tok[iT+1, iT+T+1). The test split: VAL_FILE's shards,
//                              or without VAL_FILE the *_val_* shards FILE matches (when
//                              it matches others too), else none. Every shard in one
//                              format, every token < the vocabulary; a tokenizer.model
//                              beside the training shards must have the model's vocabulary.
//   csv:FILE[:VAL_FILE]        a table (csv.h): a header row, the --label column of
//                              classes, numeric feature columns. No VAL_FILE: no test
//                              split, or --val-fraction's share of the rows (a seeded
//                              shuffle's last ones); with opt.table (eval, predict) and
//                              neither, the whole FILE is the test split.
//   images:DIR[:VALDIR]        an image folder (images.h): DIR/CLASS/*.png|jpg|jpeg, decoded,
//                              resized and centre-cropped to the model's [C, H, W]. The test
//                              split: DIR/val beside DIR/train, else VALDIR, else
//                              --val-fraction's share, else none (eval and predict: all of DIR).
//   synthetic                  learnable generated data shaped like the model's input
//   synthetic:CxHxW            synthetic images of another shape (image models only)
// Throws sat::Error naming the file (or --data) and what was expected.
DataSplit open_dataset(const std::string& spec, const DataOptions& opt);

// The datasets `synthetic` opens for this model, with their sizes and shapes only: nothing
// is generated or allocated (for planning: `saturate info`, `saturate plan`). Their get()
// is an internal error. chw: the images' shape (the model's, or synthetic:CxHxW's).
DataSplit synthetic_shapes(const DataOptions& opt, Shape chw);
inline DataSplit synthetic_shapes(const DataOptions& opt) { return synthetic_shapes(opt, opt.image_shape); }

// Parses --normalize: "MEAN,STD" (one value for all channels) or
// "M1,..,Mc,S1,..,Sc" (2C numbers: C means then C stds, e.g. for CIFAR-10
// "0.4914,0.4822,0.4465,0.2470,0.2435,0.2616"). Fills opt.mean/opt.std.
void parse_normalize(const std::string& text, DataOptions& opt);

// The first n samples of d (all of them when n >= d.size()), read through d, which must
// outlive it: an evaluation of part of a split (--eval-batches, the tuner's probes), the
// same samples whatever the layout.
std::unique_ptr<Dataset> make_prefix(const Dataset& d, int64_t n);

// Deterministic in-memory datasets (tests, parity runs). N = labels.size() /
// label_shape.numel(); samples.size() must be N * sample_shape.numel().
// Float samples: an image-like dataset (values returned as given, no scaling);
// int32 samples: a token dataset (every token and label must be < num_classes,
// labels may be -1 = ignored by the loss).
std::unique_ptr<Dataset> make_tensor_dataset(Shape sample_shape, std::vector<float> samples,
                                             std::vector<int32_t> labels, Shape label_shape,
                                             int64_t num_classes, std::string name = "memory");
std::unique_ptr<Dataset> make_tensor_dataset(Shape sample_shape, std::vector<int32_t> samples,
                                             std::vector<int32_t> labels, Shape label_shape,
                                             int64_t num_classes, std::string name = "memory");

}  // namespace sat
