#pragma once
/// \file
/// How an extension module adds node types to the `flowfeed` module's pipelines: the module holds
/// a RegistrationHook in the capsule `flowfeed._registration_hook`, and an extension (the test
/// extension flowfeed_testing, python/testing) passes it a registrar, which every
/// `Pipeline(..., test_nodes=True)` then runs on its registry. The two modules share C++ types
/// (Registry, NodeType): an extension must come from the same build tree as the module.

#include <flowfeed/registry.hpp>

namespace flowfeed::python {

/// Adds node types to a pipeline's registry.
using Registrar = void (*)(Registry& registry);

/// The capsule's pointer. `version` changes whenever this struct does.
struct RegistrationHook {
  static constexpr const char* kCapsule = "flowfeed._registration_hook";
  static constexpr int kVersion = 1;
  int version = kVersion;
  /// Keeps `registrar` for `Pipeline(..., test_nodes=True)` (once per registrar).
  void (*add_test_registrar)(Registrar registrar) = nullptr;
};

}  // namespace flowfeed::python
