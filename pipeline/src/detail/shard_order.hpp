#pragma once
/// \file
/// The resume check of sampler.order: shards (shard_order.cpp).

#include <string>

#include "flowfeed/checkpoint.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed::detail {

/// Throws ConfigError "`where`: sampler.KEY: ..." when a shuffled `checkpoint` was written with
/// another sampler.order, shuffle_window or number of data shards than `sampler` has (each
/// changes every epoch's order).
void check_shard_order(const Checkpoint& checkpoint, const Sampler& sampler,
                       const std::string& where);

}  // namespace flowfeed::detail
