#pragma once
// pipeline_runner --list-classes: the class mapping of a config's image_folder loaders.

#include <ostream>

#include "flowfeed/config.hpp"

/// Walks the root of every `image_folder` loader of `config` (top-level nodes and mix sources)
/// and prints its class mapping to `out`, one `label<TAB>class` line each, under a line naming
/// the node; returns the exit code: 0 listed, 1 a root that cannot be walked (said on `err`),
/// 2 no image_folder loader or a build without the image family.
int list_classes(const flowfeed::PipelineConfig& config, std::ostream& out, std::ostream& err);
