// The sequence of batches and exact resume (checkpoint.hpp): where a run starts in this rank's
// sequence of batches, the source's position, which of them finished, and the checkpoints
// written from that.

#include "detail/sequence.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "detail/chain.hpp"
#include "flowfeed/checkpoint.hpp"

namespace flowfeed::detail {

void Sequence::open(const SamplerOptions& options, std::size_t dataset, std::size_t batch_size,
                    int epochs, std::vector<std::size_t> shard_starts) {
  epochs_ = epochs;
  sampler_ = std::make_unique<Sampler>(options, dataset, batch_size, std::move(shard_starts));
}

std::uint64_t Sequence::run_batches_before(std::uint64_t x) const {
  x = std::min(x, sequence_end());
  if (x <= start_.first) return 0;
  std::uint64_t n = x - start_.first;
  for (std::uint64_t s : start_.skip) n -= s < x ? 1 : 0;
  return stop_after_ > 0 ? std::min(n, stop_after_) : n;
}

void Sequence::reset_cursor(std::size_t depth) {
  cursor_.reset(start_.first, start_.skip, depth);
}

void Sequence::begin(const RunLimits& options, std::size_t depth) {
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
  reset_cursor(depth);
  std::lock_guard<std::mutex> lock(stream_mutex_);
  const auto epochs = static_cast<std::size_t>(stream() ? epochs_ : 0);
  stream_batches_.assign(epochs, ~0ull);
  stream_first_seq_.assign(epochs, ~0ull);
  stream_end_seq_.assign(epochs, ~0ull);
  stream_delivered_ = 0;
  stream_stopped_ = false;
}

bool Sequence::exhausted() {
  // Batches a resumed unordered run had finished out of order are not delivered again.
  while (source_skip_ < start_.skip.size() && start_.skip[source_skip_] <= source_pos_) {
    if (start_.skip[source_skip_] == source_pos_) ++source_pos_;
    ++source_skip_;
  }
  if (!stream()) {
    return source_pos_ >= sequence_end() || (stop_after_ > 0 && source_seq_ >= stop_after_);
  }
  std::lock_guard<std::mutex> lock(stream_mutex_);
  // Past the end of its epoch's data the source goes on with the next epoch.
  const std::uint64_t per_epoch = sampler_->batches_per_epoch();
  const std::uint64_t epoch = source_pos_ / per_epoch;
  if (epoch < stream_batches_.size() && source_pos_ % per_epoch >= stream_batches_[epoch]) {
    const std::uint64_t next = (epoch + 1) * per_epoch;
    cursor_.skip_range(source_pos_, next);
    source_pos_ = next;
  }
  // stop_after is counted where a stream's batches are known to hold data (keep()).
  const bool over = source_pos_ >= sequence_end() || stream_stopped_;
  if (over && order_epoch_ < stream_end_seq_.size() && stream_end_seq_[order_epoch_] == ~0ull) {
    stream_end_seq_[order_epoch_] = source_seq_;
  }
  return over;
}

bool Sequence::keep(const Batch& b) {
  if (!stream()) {
    if (b.end_of_data) {
      throw std::logic_error("Batch::end_of_data set by a loader whose size() is known");
    }
    return true;
  }
  const std::size_t rows = b.rows();
  bool keep = !b.end_of_data ||
              (rows > 0 && !(sampler_->options().drop_last && rows < sampler_->batch_size()));
  std::lock_guard<std::mutex> lock(stream_mutex_);
  if (b.end_of_data && b.epoch < stream_batches_.size()) {
    std::uint64_t& known = stream_batches_[b.epoch];
    if (known == ~0ull) {
      known = b.index_in_epoch + (keep ? 1 : 0);
      // The source is still in this epoch (it leaves one only past its end): what it emitted of
      // it so far is all the epoch has.
      if (stream_end_seq_[b.epoch] == ~0ull) stream_end_seq_[b.epoch] = source_seq_;
    }
    keep = keep && b.index_in_epoch < known;
  }
  if (keep && stop_after_ > 0 && (stream_stopped_ || ++stream_delivered_ > stop_after_)) {
    // The run stops here: this batch and those the source let in after it are not delivered,
    // and the cursor stays at the first of them.
    stream_stopped_ = true;
    keep = false;
  }
  return keep;
}

std::optional<std::pair<std::uint64_t, std::uint64_t>> Sequence::stream_epoch_seqs(
    std::uint32_t epoch) const {
  std::lock_guard<std::mutex> lock(stream_mutex_);
  if (epoch >= stream_end_seq_.size() || stream_end_seq_[epoch] == ~0ull) return std::nullopt;
  const std::uint64_t end = stream_end_seq_[epoch];
  const std::uint64_t first = stream_first_seq_[epoch];
  return std::make_pair(first == ~0ull ? end : first, end);
}

std::uint64_t Sequence::epoch_of_run_batch(std::uint64_t seq) const {
  if (!stream()) return (start_.first + seq) / sampler_->batches_per_epoch();
  std::lock_guard<std::mutex> lock(stream_mutex_);
  std::uint64_t epoch = start_.first / sampler_->batches_per_epoch();
  for (std::size_t e = 0; e < stream_first_seq_.size(); ++e) {
    if (stream_first_seq_[e] != ~0ull && stream_first_seq_[e] <= seq) epoch = e;
  }
  return epoch;
}

std::uint64_t Sequence::past_stream_end(std::uint64_t x) const {
  if (!stream()) return x;
  const std::uint64_t per_epoch = sampler_->batches_per_epoch();
  const std::uint64_t epoch = x / per_epoch;
  std::lock_guard<std::mutex> lock(stream_mutex_);
  if (epoch < stream_batches_.size() && x % per_epoch >= stream_batches_[epoch]) {
    return (epoch + 1) * per_epoch;
  }
  return x;
}

void Sequence::assign(Batch& b) {
  const std::uint64_t per_epoch = sampler_->batches_per_epoch();
  const auto epoch = static_cast<std::uint32_t>(source_pos_ / per_epoch);
  const std::uint64_t index = source_pos_ % per_epoch;
  if (stream()) {
    std::lock_guard<std::mutex> lock(stream_mutex_);
    if (epoch != order_epoch_) {
      // The epoch before is over for the source (its end, or its most batches).
      if (order_epoch_ < stream_end_seq_.size() && stream_end_seq_[order_epoch_] == ~0ull) {
        stream_end_seq_[order_epoch_] = source_seq_;
      }
      if (epoch < stream_first_seq_.size()) stream_first_seq_[epoch] = source_seq_;
      order_epoch_ = epoch;
    } else if (epoch < stream_end_seq_.size() && stream_end_seq_[epoch] == source_seq_) {
      // The loader found the epoch's end after exhausted() let this batch through: it is one
      // more (past the end) of the epoch's batches.
      ++stream_end_seq_[epoch];
    }
    b.seq = source_seq_++;
    b.epoch = epoch;
    b.index_in_epoch = index;
    sampler_->batch_samples(source_order_, index, b.samples);
    ++source_pos_;
    return;
  }
  if (epoch != order_epoch_) {
    source_order_ = sampler_->epoch_order(epoch);
    order_epoch_ = epoch;
  }
  b.seq = source_seq_++;
  b.epoch = epoch;
  b.index_in_epoch = index;
  sampler_->batch_samples(source_order_, index, b.samples);
  ++source_pos_;
}

void Sequence::finish(const Batch& b) {
  const std::uint64_t position = b.epoch * sampler_->batches_per_epoch() + b.index_in_epoch;
  // A stream's batch dropped by stop_after, not past its epoch's end, was never delivered: a
  // resume delivers it.
  if (b.past_end && past_stream_end(position) == position) return;
  cursor_.finish(position);
}

void Sequence::resume_from_checkpoint(const PipelineConfig& config, const Chain& chain) {
  const Checkpoint c =
      read_checkpoint(expand_rank(config.pipeline.resume_from, config.sampler.rank));
  const std::string manifest = c.dir + "/" + kCheckpointManifest;
  start_ = resume_point(c, *sampler_, static_cast<std::uint32_t>(epochs_), manifest);
  resumed_steps_ = c.steps;
  for (const auto& s : chain.stages()) {
    if (!s->node().has_state()) continue;
    const std::string state = read_node_state(c, s->spec().name);
    const NodeStateFile& file = c.nodes.at(s->spec().name);
    if (file.type != s->spec().type) {
      throw ConfigError({manifest + ": nodes." + s->spec().name +
                         ".type: the checkpoint holds the state of a '" + file.type +
                         "' node, this node is a '" + s->spec().type +
                         "' (a resume continues the same pipeline) resume with the same node "
                         "types"});
    }
    try {
      s->node().load_state(state);
    } catch (const std::exception& e) {
      throw ConfigError(
          {manifest + ": nodes." + s->spec().name + ": " + file.file + ": " + e.what()});
    }
  }
}

void Sequence::resume(ResumePoint start, std::uint64_t steps, std::size_t depth) {
  start_ = std::move(start);
  resumed_steps_ = steps;
  reset_cursor(depth);
}

Checkpoint Sequence::checkpoint() const {
  std::vector<std::uint64_t> ahead;
  // Past the end of a stream's epoch, the next epoch is next: a resume need not read the stream
  // to its end again to learn that.
  const std::uint64_t next = past_stream_end(cursor_.next(&ahead));
  // Batches past a stream's end were dropped, not delivered: nothing to skip after a resume.
  std::erase_if(ahead,
                [this, next](std::uint64_t a) { return a <= next || past_stream_end(a) != a; });
  return make_checkpoint(*sampler_, next, ahead, resumed_steps_ + cursor_.finished());
}

Checkpoint Sequence::gather(const Chain& chain, States& states) const {
  states.clear();
  const Checkpoint c = checkpoint();
  for (const auto& s : chain.stages()) {
    if (!s->node().has_state()) continue;
    std::string bytes;
    s->node().save_state(bytes);
    states[s->spec().name] = {s->spec().type, std::move(bytes)};
  }
  return c;
}

Checkpoint Sequence::checkpoint(const Chain& chain, States& states) const {
  // One writer at a time, as save_checkpoint(): the cursor and the states are taken together.
  std::lock_guard<std::mutex> lock(checkpoint_mutex_);
  return gather(chain, states);
}

void Sequence::save_checkpoint(const Chain& chain, const std::string& dir) const {
  // The directory a run opened is held still: a second CheckpointDir on it would be refused.
  if (own_checkpoint_ && own_checkpoint_->path() == dir) {
    return save_checkpoint(chain, *own_checkpoint_);
  }
  CheckpointDir held(dir);
  save_checkpoint(chain, held);
}

void Sequence::save_checkpoint(const Chain& chain, CheckpointDir& dir) const {
  // One writer at a time: branches finish batches concurrently.
  std::lock_guard<std::mutex> lock(checkpoint_mutex_);
  States states;
  const Checkpoint c = gather(chain, states);
  dir.write(c, states);
}

void Sequence::checkpoint_after(const Chain& chain, std::uint64_t finished) const {
  if (checkpoint_every_ > 0 && finished % checkpoint_every_ == 0) {
    save_checkpoint(chain, *checkpoint_dir_);
  }
}

}  // namespace flowfeed::detail
