#pragma once
/// \file
/// The Python node types' names and params, for every build: their bodies live in the Python
/// module (python/nodes/), which registers the real types; pipeline_runner registers them there
/// too when built with Python, and these placeholders otherwise.

#include "flowfeed/registry.hpp"
#include "flowfeed/schema.hpp"

namespace flowfeed {

/// `python` (load): callable, samples, batched, layout.
Schema python_loader_schema();
/// `python_iterable` (load): callable, samples, layout.
Schema python_iterable_schema();
/// `python_transform` (transform): callable.
Schema python_transform_schema();

/// Registers python, python_iterable and python_transform with their params, each rejected at
/// validation as unavailable in this build (a build without Python), so that a config naming
/// them gets a clear error instead of "unknown type".
void register_python_placeholders(Registry& registry);

}  // namespace flowfeed
