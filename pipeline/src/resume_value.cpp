// Exact resume from values rather than a directory (Python's state_dict / load_state_dict): the
// cursor and the nodes' states as Pipeline::checkpoint(NodeStates&) gives them, and
// Pipeline::resume() taking them back with the checks pipeline.resume_from makes.

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "detail/pipeline_impl.hpp"
#include "flowfeed/checkpoint.hpp"
#include "flowfeed/pipeline.hpp"

namespace flowfeed {

Checkpoint Pipeline::checkpoint(NodeStates& states) const {
  return impl_->checkpoint(states);
}

void Pipeline::resume(const Checkpoint& checkpoint, const NodeStates& states,
                      const std::string& where) {
  impl_->resume(checkpoint, states, where);
}

void detail::PipelineImpl::resume(const Checkpoint& checkpoint, const NodeStates& states,
                                  const std::string& where) {
  if (running_) {
    throw std::logic_error(
        "Pipeline::resume: the pipeline is running (resume between runs: end the run or session "
        "first)");
  }
  auto fail = [&](const std::string& key, const std::string& problem) {
    throw ConfigError({fmt::format("{}: {}: {}", where, key, problem)});
  };
  // The same checks as a checkpoint file: the sample order, and a cursor inside this run.
  const ResumePoint start = resume_point(
      checkpoint, sequence_.sampler(), static_cast<std::uint32_t>(config_.pipeline.epochs), where);
  // Every node that keeps state finds its own, of its type, before any loads it.
  for (const auto& s : chain_.stages()) {
    if (!s->node().has_state()) continue;
    auto it = states.find(s->spec().name);
    if (it == states.end()) {
      fail("nodes." + s->spec().name,
           fmt::format("missing (the state has none for node '{}', which keeps some) resume "
                       "from a state of this pipeline",
                       s->spec().name));
    }
    if (it->second.first != s->spec().type) {
      fail("nodes." + s->spec().name + ".type",
           fmt::format("the state is that of a '{}' node, this node is a '{}' (a resume continues "
                       "the same pipeline) resume with the same node types",
                       it->second.first, s->spec().type));
    }
  }
  for (const auto& [name, state] : states) {
    bool known = false;
    for (const auto& s : chain_.stages())
      known = known || (s->spec().name == name && s->node().has_state());
    if (!known) {
      fail("nodes." + name,
           fmt::format("this pipeline has no node '{}' that keeps state (the state is from "
                       "another pipeline) resume from a state of this pipeline",
                       name));
    }
  }
  for (const auto& s : chain_.stages()) {
    if (!s->node().has_state()) continue;
    try {
      s->node().load_state(states.at(s->spec().name).second);
    } catch (const std::exception& e) {
      fail("nodes." + s->spec().name, e.what());
    }
  }
  sequence_.resume(start, checkpoint.steps, static_cast<std::size_t>(plan_.prefetch_depth));
}

}  // namespace flowfeed
