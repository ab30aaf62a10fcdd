#pragma once
// Config validation's rules that the pipeline applies again to a config it was handed unvalidated.

#include <string>
#include <vector>

#include "flowfeed/config.hpp"

namespace flowfeed::detail {

/// The chain's order rules (load first, train last or none in pull mode, staging before upload)
/// checked on a config's nodes as they are; one message per misplaced node, with its position.
std::vector<std::string> chain_problems(const PipelineConfig& config);

}  // namespace flowfeed::detail
