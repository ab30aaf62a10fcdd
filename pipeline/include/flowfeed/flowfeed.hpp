#pragma once
/// \file
/// Umbrella header of the flowfeed framework. CUDA stays out: nothing here includes a CUDA header.

#include "flowfeed/batch.hpp"
#include "flowfeed/build_plan.hpp"
#include "flowfeed/builder.hpp"
#include "flowfeed/checkpoint.hpp"
#include "flowfeed/config.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/gauge.hpp"
#include "flowfeed/node.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/range_hooks.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/sampler.hpp"
#include "flowfeed/schema.hpp"
#include "flowfeed/session.hpp"
#include "flowfeed/stats.hpp"
#include "flowfeed/trace.hpp"
