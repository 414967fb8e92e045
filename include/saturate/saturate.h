// saturate as a C++ library (README "Your own model"): build or load a model, open or wrap
// data, fit, evaluate, predict, save. Link with find_package(saturate) and
// target_link_libraries(app PRIVATE saturate::saturate).
#pragma once
#include "saturate/data.h"
#include "saturate/fit.h"
#include "saturate/model.h"
#include "saturate/plan.h"
