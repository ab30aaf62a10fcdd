#pragma once
/// \file
/// Resident mode: the baseline a streamed training run is compared with. The train node takes the
/// loader's whole data set at build time (on the device for CUDA) and trains from views of it, in
/// the same batch order as the streamed run, with no staging or upload work per batch.

#include "flowfeed/config.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

/// The resident variant of a streamed config: the same pipeline options, sampler, loader and
/// train node, with every node between them removed and the loader's `resident` param set.
/// Throws ConfigError when the loader type has no `resident` param (only in-memory loaders such
/// as `idx` do) or the train node cannot take a resident data set (only `mlp` can).
PipelineConfig resident_config(const PipelineConfig& streamed, const Registry& registry);

}  // namespace flowfeed
