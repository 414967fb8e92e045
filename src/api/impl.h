// The library's handles (include/saturate/) over the engine's own types: a Model is a
// checked ModelConfig and, once it has any, its weights in a host ParamStore of the whole
// model; a Dataset is an engine Dataset shared by its copies. Every entry point turns the
// engine's sat::Error into saturate::Error (guarded).
#pragma once
#include <memory>
#include <string>
#include <utility>

#include "core/error.h"
#include "data/dataset.h"
#include "nn/models.h"
#include "nn/params.h"
#include "saturate/data.h"
#include "saturate/model.h"

namespace saturate {

struct Model::Impl {
  sat::ModelConfig config;
  std::string spec;  // as --model takes it ("" : built here, from a model file's text)
  std::string json;  // the model file's text ("" : a built-in)
  std::unique_ptr<sat::ParamStore> weights;  // null: none yet
};

struct Dataset::Impl {
  std::shared_ptr<const sat::Dataset> data;
  bool labelled = true;
};

// fn() with the engine's errors as the library's.
template <typename F>
auto guarded(F&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const sat::Error& e) {
    throw Error(e.what());
  }
}

// The whole model's parameters and states, on the host, without optimizer state.
std::unique_ptr<sat::ParamStore> empty_weights(const sat::ModelConfig& mc);
// Copies every parameter and state of `from` into `to` by name (the same model).
void copy_weights(const sat::ParamStore& from, sat::ParamStore& to);

}  // namespace saturate
