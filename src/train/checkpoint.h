// Checkpoints on disk: what a training job writes to resume later, under the same layout or
// another one.
//
// A checkpoint is a directory ROOT/step-NNNNNNNN holding one safetensors file per writing
// rank (rank-RRRRR.safetensors: the pieces that rank holds) and manifest.json, written last:
// the run's position (step, epoch, batch within it, seed), the layout that wrote it, the
// optimizer's step count, the losses so far, every file's size and CRC-32, and every
// *logical* tensor (the full tensor of one parameter, model state or optimizer slot, on any
// layout) with the pieces that make it up. A piece is a tensor of one file that is part
// `index` of `parts` along dimension `dim` in the tensor-parallel way (nn/shard.h), or the
// whole tensor. A reader assembles the full tensor from its pieces and keeps the part its
// own layout needs: resharding is reading.
//
// Atomic: the files go to ROOT/.step-NNNNNNNN.tmp, are fsynced, the manifest is written
// and fsynced last, and the directory is renamed into place (then ROOT is fsynced). A crash
// at any moment leaves every earlier checkpoint complete; a directory without a manifest
// that parses and whose files match it is not a checkpoint.
//
// Checked: the manifest carries a checksum of its own content (`checksum`, the CRC-32 of
// the canonical serialisation of every other key), and its redundant fields must agree
// (the losses are one per step, the optimizer's steps and the data position follow from the
// step, the global batch from the layout...): an edited or damaged manifest is refused, not
// trusted. It also records the run's settings (`settings`: the configuration every rank
// agreed on, train/agree.h), which a resumed run is compared with (train/resume_policy.h).
#pragma once
#include <cstdint>
#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"

namespace sat {

// One piece of a logical tensor, in a file of the checkpoint.
struct CkptPiece {
  std::string file, key;
  int dim = -1, parts = 1, index = 0, stride = 1;  // as ParamShard; dim -1: the whole tensor
};

struct CkptTensor {
  std::vector<int64_t> shape;  // the full tensor's
  std::string dtype;           // safetensors' name: F32, I64, ...
  std::vector<CkptPiece> pieces;
};

struct CkptFile {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

struct CkptLayout {
  int world = 1, dp = 1, tp = 1, pp = 1, zero = 0, virtual_stages = 1;
  bool sequence_parallel = false;
  std::string schedule = "1f1b";
  int cp = 1;  // context-parallel ranks (--cp; in the manifest only when more than 1)
  int ep = 1;  // expert-parallel ranks (--ep; in the manifest only when more than 1)
};

struct Manifest {
  std::string model;          // the model string (a preset name or a family string)
  int64_t parameters = 0;
  int64_t step = 0;           // optimizer steps done
  int64_t total_steps = 0;    // of the run that wrote it
  int64_t epoch = 0;          // the data position of the next step
  int64_t step_in_epoch = 0;
  int64_t global_batch = 0;
  int64_t micro_batch = 0, accum = 1;
  // GPT models trained with --seq-len: the window; 0 (and absent from the file) when it is
  // the context, so that manifests without --seq-len are as they always were.
  int64_t seq_len = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  std::string optimizer;      // sgd | adamw
  int64_t optimizer_steps = 0;
  std::vector<std::string> slots;  // the optimizer's state arrays, by name
  CkptLayout layout;
  std::vector<double> losses;      // every step's so far
  std::map<std::string, CkptFile> files;
  std::map<std::string, CkptTensor> tensors;  // "param/NAME", "state/NAME", "optim/SLOT/NAME"
  std::map<std::string, std::string> settings;  // the run's, as "key" -> "value" (train/resume_policy.h)
  // A --keep-best checkpoint (train/validation.h): the metric that made it the best and its
  // value at this step, as "best": {"metric", "value", "step"} ("": not such a checkpoint).
  std::string best_metric;
  double best_value = 0;
};

// "step-00000020".
std::string checkpoint_name(int64_t step);
// The manifest's text, with its checksum.
std::string manifest_json(const Manifest& m);
// The checksum a manifest's text must carry: "crc32:XXXXXXXX" of the compact, key-sorted
// serialisation of the JSON object without its `checksum` key (sat::Error when the text is
// not a JSON object).
std::string manifest_checksum(const std::string& text);
// Parses and validates a manifest: its checksum, every key, and the redundant fields against
// each other (sat::Error naming `where` and the key, or saying it has been edited or damaged).
Manifest parse_manifest(const std::string& text, const std::string& where);
// The parameters the manifest's "param/" tensors hold (their full shapes).
int64_t manifest_parameters(const Manifest& m);
// Reads DIR/manifest.json (sat::Error naming it when absent or malformed).
Manifest read_manifest(const std::string& dir);
// Checks every file of the manifest: present, of its size and CRC-32 (sat::Error naming the
// file and what is wrong).
void verify_checkpoint(const std::string& dir, const Manifest& m);
// The newest complete checkpoint under ROOT (its manifest parses and names files of the
// sizes it says), or "" when there is none. Incomplete ones are skipped, not removed.
std::string newest_checkpoint(const std::string& root);
// DIR itself when it holds a manifest, else the newest complete checkpoint under it
// (sat::Error naming the flag when there is none).
std::string resolve_checkpoint(const std::string& dir_or_root, const std::string& flag);
// The full tensor `name` assembled from its pieces, as raw bytes (sat::Error naming the
// checkpoint when the tensor is absent, of another shape or dtype, or its pieces do not
// cover it).
std::vector<uint8_t> read_logical(const std::string& dir, const Manifest& m, const std::string& name,
                                  const Shape& shape, DType dtype);

// One tensor a rank writes: raw bytes and where they belong.
struct CkptEntry {
  std::string name;  // logical name
  std::vector<int64_t> full_shape;
  DType dtype = DType::f32;
  int dim = -1, parts = 1, index = 0, stride = 1;
  const void* data = nullptr;
  std::vector<int64_t> shape;  // of this piece
};
// Writes `entries` to DIR/FILE as safetensors (fsynced) and records the file and its
// pieces in `m` (the piece keys are the logical name, plus "@tpI/P" for a part). A
// data_schema (Dataset::schema()) goes into the file's metadata.
void write_pieces(const std::string& dir, const std::string& file, const std::vector<CkptEntry>& entries,
                  Manifest& m, const std::string& data_schema = "");
// The fragment of a manifest that one rank writes beside its file, merged in rank order: the
// tensor-parallel parts of a tensor join, and a part already present (a tied weight held by
// two pipeline stages) keeps the first stage's.
void merge_fragment(Manifest& into, const Manifest& fragment);
// fsync of a file or directory (sat::Error naming it).
void sync_path(const std::string& path);
// Keeps the newest `keep` complete checkpoints under ROOT (keep <= 0: all); removes stale
// temporary directories of writers that died. Touches nothing but directories named as
// saturate names them (step-NNNNNNNN, .step-NNNNNNNN.tmp); the caller must hold ROOT's
// DirLock (train/dir_lock.h), so that no other run's are among them.
void prune_checkpoints(const std::string& root, int keep);
// The step of a directory named checkpoint_name(step) (or, with tmp, the temporary one's
// name), or -1 for any other name.
int64_t checkpoint_step_of(const std::string& name, bool tmp = false);
std::string temp_checkpoint_dir(const std::string& root, int64_t step);

// A checkpoint being written (Trainer::save_checkpoint): the manifest's header, this rank's
// pieces copied out of the training state, and the thread writing them to the temporary
// directory; finished collectively once every rank's thread is done.
struct CheckpointWrite {
  std::string root, tmp;
  std::string dest;                        // --keep-best: the directory it replaces ("": root/step-NNNNNNNN)
  std::string flag = "--checkpoint-dir";   // what its errors name
  int64_t step = 0;
  Manifest man;
  std::vector<std::vector<uint8_t>> data;  // owned copies the entries point into
  std::vector<std::vector<float>> slots;   // the optimizer's state arrays, whole (entries point into them)
  std::vector<CkptEntry> entries;
  bool writer = false;                     // this rank writes a file
  std::string data_schema;                 // the training data's (Dataset::schema()), kept in the file
  std::thread thread;
  std::atomic<bool> done{false};
  std::string error;                       // the thread's failure
  double started = 0, paused = 0;          // when; how long training waited for the copies
  ~CheckpointWrite() {
    if (thread.joinable()) thread.join();
  }
};

}  // namespace sat
