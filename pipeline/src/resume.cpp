// Exact resume (checkpoint.hpp): where a run starts in this rank's sequence of batches, which of
// them finished, and the checkpoints written from that.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "detail/pipeline_impl.hpp"
#include "flowfeed/checkpoint.hpp"

namespace flowfeed::detail {

std::uint64_t PipelineImpl::run_batches_before(std::uint64_t x) const {
  x = std::min(x, sequence_end());
  if (x <= start_.first) return 0;
  std::uint64_t n = x - start_.first;
  for (std::uint64_t s : start_.skip) n -= s < x ? 1 : 0;
  return stop_after_ > 0 ? std::min(n, stop_after_) : n;
}

void PipelineImpl::begin_sequence(const RunOptions& options) {
  if (options.checkpoint_every > 0 && options.checkpoint_dir.empty() && !options.checkpoint) {
    throw std::invalid_argument("RunOptions::checkpoint_every needs a checkpoint directory");
  }
  source_seq_ = 0;
  source_pos_ = start_.first;
  source_skip_ = 0;
  order_epoch_ = ~0u;
  stop_after_ = options.stop_after;
  checkpoint_every_ = options.checkpoint_every;
  checkpoint_dir_ = options.checkpoint;
  if (!checkpoint_dir_ && !options.checkpoint_dir.empty()) {
    // Held from before the first batch, so that a directory that is not ours, or one another run
    // writes, is refused before any work is done.
    if (!own_checkpoint_ || own_checkpoint_->path() != options.checkpoint_dir) {
      own_checkpoint_.reset();
      own_checkpoint_ = std::make_unique<CheckpointDir>(options.checkpoint_dir);
    }
    checkpoint_dir_ = own_checkpoint_.get();
  }
  cursor_.reset(start_.first, start_.skip,
                static_cast<std::size_t>(config_.pipeline.prefetch_depth));
}

void PipelineImpl::resume_from_checkpoint() {
  const Checkpoint c =
      read_checkpoint(expand_rank(config_.pipeline.resume_from, config_.sampler.rank));
  const std::string manifest = c.dir + "/" + kCheckpointManifest;
  start_ =
      resume_point(c, *sampler_, static_cast<std::uint32_t>(config_.pipeline.epochs), manifest);
  resumed_steps_ = c.steps;
  for (const auto& s : stages_) {
    if (!s->node->has_state()) continue;
    const std::string state = read_node_state(c, s->spec.name);
    const NodeStateFile& file = c.nodes.at(s->spec.name);
    if (file.type != s->spec.type) {
      throw ConfigError({manifest + ": nodes." + s->spec.name +
                         ".type: the checkpoint holds the state of a '" + file.type +
                         "' node, this node is a '" + s->spec.type +
                         "' (a resume continues the same pipeline) resume with the same node "
                         "types"});
    }
    try {
      s->node->load_state(state);
    } catch (const std::exception& e) {
      throw ConfigError(
          {manifest + ": nodes." + s->spec.name + ": " + file.file + ": " + e.what()});
    }
  }
}

Checkpoint PipelineImpl::checkpoint() const {
  std::vector<std::uint64_t> ahead;
  const std::uint64_t next = cursor_.next(&ahead);
  return make_checkpoint(*sampler_, next, ahead, resumed_steps_ + cursor_.finished());
}

void PipelineImpl::save_checkpoint(const std::string& dir) const {
  // The directory a run opened is held still: a second CheckpointDir on it would be refused.
  if (own_checkpoint_ && own_checkpoint_->path() == dir) return save_checkpoint(*own_checkpoint_);
  CheckpointDir held(dir);
  save_checkpoint(held);
}

void PipelineImpl::save_checkpoint(CheckpointDir& dir) const {
  // One writer at a time: branches finish batches concurrently.
  std::lock_guard<std::mutex> lock(checkpoint_mutex_);
  const Checkpoint c = checkpoint();
  std::map<std::string, std::pair<std::string, std::string>> states;
  for (const auto& s : stages_) {
    if (!s->node->has_state()) continue;
    std::string bytes;
    s->node->save_state(bytes);
    states[s->spec.name] = {s->spec.type, std::move(bytes)};
  }
  dir.write(c, states);
}

}  // namespace flowfeed::detail
