// One rank of a training job, built once: its place on the process mesh, its device and the
// device side of the mesh's groups, its stage of the job's plan, the parameters, the engine,
// the optimizer, the loaders, the gradient reduction, and the executor with the step's named
// parts. Everything the step loop (train/trainer.h), evaluation, weights and checkpoints
// work on; nothing here runs a step.
//
// Built in three phases (each a function): connect (the job's agreement and validation, the
// mesh, the device, the plan), the state (parameters, optimizer, engine), the step (loaders,
// reduction, parts, executor). Destroyed in the reverse order, the stage's graph before the
// device whose communicators its tensor-parallel layers hold work of.
#pragma once
#include <memory>
#include <string>

#include "backend/device_backend.h"
#include "device/devices.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "dist/comm.h"
#include "dist/mesh.h"
#include "nn/engine.h"
#include "nn/params.h"
#include "optim/optimizer.h"
#include "train/config.h"
#include "train/data_parallel.h"
#include "train/executor.h"
#include "train/grad_clip.h"
#include "train/plan.h"
#include "train/step_parts.h"

namespace sat {

// The device side of the mesh's groups this rank's step uses.
struct DeviceGroups {
  dist::Comm* dp = nullptr;   // the gradient reduction's
  dist::Comm* tp = nullptr;   // the tensor-parallel layers'
  dist::Comm* pp = nullptr;   // the pipeline's transfers (null without pipelining)
  dist::Comm* tie = nullptr;  // weights tied across stages (null where none)
  bool reduces = false;       // the reduction communicates (dp > 1, or NCCL asked alone)
};

class RankRuntime {
 public:
  // job: the job's plan built by the caller (null: planned here). train and test (may be
  // null) must outlive the runtime, and so must job.
  RankRuntime(JobPlan* job, const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test);
  ~RankRuntime();
  RankRuntime(const RankRuntime&) = delete;
  RankRuntime& operator=(const RankRuntime&) = delete;

  ModelConfig mc;             // the model as this rank runs it
  TrainConfig cfg;            // optimizer and schedule resolved
  const Dataset& train;
  const Dataset* test;        // null without evaluation
  std::string fingerprint;    // the configuration every rank agreed on (train/agree.h)
  dist::Comm* world = nullptr;
  std::unique_ptr<dist::Mesh> mesh;
  std::unique_ptr<DeviceBackend> device;
  DeviceGroups groups;
  JobPlan* job = nullptr;
  RankPlan* plan = nullptr;   // this rank's stage of the job
  std::unique_ptr<ParamStore> params;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<DeviceOptimizer> optimizer;
  std::unique_ptr<BatchLoader> train_loader, test_loader;  // on ranks whose chunks read data
  ShardedDP* sharded = nullptr;       // ZeRO-2/3: the reduction, also the engine's node hooks
  std::unique_ptr<GradSync> sync;     // the gradient reduction
  std::unique_ptr<BatchFeed> feed;
  std::unique_ptr<PartialGradSum> partial_sum;  // sequence parallelism's (null: none)
  std::unique_ptr<NoiseProbe> noise;            // --noise-scale (null: off)
  std::unique_ptr<GradClip> clip;               // --clip-grad-norm (null: off)
  std::unique_ptr<Executor> exec;
  StepParts parts;

  // The parameters as full tensors: the store itself, or under ZeRO-3 a gathered copy in
  // `keep` (collective over dp).
  const ParamStore& unsharded(std::unique_ptr<ParamStore>& keep) const;
  // Every data-parallel replica's parameters and states from dp rank 0 (collective over the
  // replica group).
  void broadcast_store(ParamStore& ps) const;
  // The ranks whose stores are replicas of this one: the data-parallel group, or under --ep
  // the expert-data-parallel group (the ranks that hold the same experts).
  dist::Comm& replica_group() const;
  // Per-replica BatchNorm statistics differ between data-parallel ranks: evaluate (and save)
  // the first replica's, as DDP does by broadcasting its buffers.
  void sync_states_from_first_replica();
  // The payload bytes each group has moved so far (the mesh's groups and their device twins).
  GroupBytes traffic() const;

 private:
  void connect(JobPlan* job, const ModelConfig& mc, int world_size);
  void build_state();
  void init_params();
  void build_step();

  std::unique_ptr<dist::Comm> own_comm_;
  std::unique_ptr<JobPlan> own_job_;
  struct ReplicaSumOverComm;
  std::unique_ptr<ReplicaSum> replica_sum_;
};

}  // namespace sat
