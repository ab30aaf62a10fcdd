// The `mix` loader: batches drawn from several loaders (its `sources:`) in proportion to their
// weights. Its data set is one epoch of positions; mix_order says which source and which of its
// samples each position is, and each source writes its rows straight into the mix's buffer
// (LoaderNode::fill_rows) or, when it has no such path, into a batch of its own that is copied.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/drop_log.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/detail/mix_order.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/stats.hpp"
#include "mix_sources.hpp"

namespace flowfeed {

namespace {

constexpr std::size_t kMaxSources = 256;  // a position's source is one byte

std::string describe(const TensorSpec& t) {
  std::string shape = "[";
  for (std::size_t i = 0; i < t.shape.size(); ++i) {
    shape += (i ? ", " : "") + std::to_string(t.shape[i]);
  }
  return std::string(dtype_name(t.dtype)) + " " + shape + "]";
}

class MixLoader final : public LoaderNode {
 public:
  explicit MixLoader(const NodeSpec& spec);
  /// Fills the plan's memory (Port::fills): the staging node's, when one takes batches in place.
  Port port(const BuildContext& /*context*/) const override {
    return {.fills = true, .in_place = std::nullopt};
  }
  void setup(BuildContext& context) override;
  void begin_run() override;
  void process(Batch& batch) override;
  void quiesce() noexcept override;
  void finish(RunReport& report) override;
  std::size_t size() const override { return order_ ? order_->plan().epoch_size : 0; }
  std::vector<TensorSpec> sample_tensors() const override { return tensors_; }

 private:
  struct Source {
    NodeSpec spec;
    std::unique_ptr<Node> owner;
    LoaderNode* node = nullptr;
    double weight = 1;
    std::string label;        // "source 1 (npy)": after the pipeline's "node 'load' (...)"
    std::string full_label;   // "node 'load' source 1 (npy)": on its own
    bool fills_rows = false;  // writes straight into the mix's buffer
  };
  // What one body needs while it fills a batch; kept for the next body (no allocation per batch).
  struct Work {
    std::vector<std::uint8_t> row_source;   // each row's source
    std::vector<std::uint32_t> row_sample;  // and its sample of that source
    std::vector<std::uint32_t> row_index;   // 0, 1, 2, ...: the rows of a run
    // The rows of each source that fills through process(), and their samples.
    std::vector<std::vector<std::uint32_t>> samples, rows;
    std::vector<std::unique_ptr<Batch>> batches;
    std::vector<std::byte*> bases;
    std::vector<std::size_t> dropped;
    std::vector<std::uint64_t> kept;
  };

  /// Runs `f`, naming the source in what it throws: a config error line by line as
  /// "file:line:col: node 'load' source 1 (npy): ...", anything else as "source 1 (npy): ...".
  template <typename F>
  auto as_source(const Source& s, F&& f) -> decltype(f());
  std::unique_ptr<Work> take_work();
  void give_back(std::unique_ptr<Work> work);
  void fill_by_process(std::size_t k, const Batch& batch, Work& w);

  std::string name_;
  SourceLoc loc_;
  std::uint64_t samples_ = 0;  // 0: the epoch ends when the first source is exhausted
  std::vector<Source> sources_;
  std::vector<TensorSpec> tensors_;
  std::vector<std::size_t> sample_bytes_;
  std::unique_ptr<MixOrder> order_;
  std::unique_ptr<MixTables> tables_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> drawn_;
  Tier tier_ = Tier::host;
  BufferPool* pool_ = nullptr;
  std::size_t batch_size_ = 0;
  std::mutex work_mutex_;
  std::vector<std::unique_ptr<Work>> idle_work_;
};

template <typename F>
auto MixLoader::as_source(const Source& s, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const ConfigError& e) {
    // Each line at the source's place in the config (not the position the source's own or the
    // pipeline's message gave, which is the source's or the mix node's).
    std::vector<std::string> lines;
    const std::string own = s.spec.loc.str() + ": ";
    const std::string file = s.spec.loc.file + ":";
    for (const std::string& line : e.problems()) {
      std::size_t rest = 0;
      if (!s.spec.loc.file.empty() && line.rfind(file, 0) == 0) {
        std::size_t at = file.size();
        while (at < line.size() &&
               (std::isdigit(static_cast<unsigned char>(line[at])) || line[at] == ':')) {
          ++at;
        }
        if (at > file.size() && line.compare(at, 1, " ") == 0 && line[at - 1] == ':') {
          rest = at + 1;
        }
      }
      lines.push_back(own + s.full_label + ": " + line.substr(rest));
    }
    throw ConfigError(std::move(lines));
  } catch (const BatchDroppedError&) {
    throw;
  } catch (const DataError& e) {
    throw DataError(s.label + ": " + e.what());
  } catch (const std::exception& e) {
    throw Error(s.label + ": " + e.what());
  }
}

MixLoader::MixLoader(const NodeSpec& spec) : name_(spec.name), loc_(spec.loc) {
  if (spec.params.get_string("epoch") == "samples") {
    samples_ = static_cast<std::uint64_t>(spec.params.get_int("samples"));
  }
  if (spec.sources.size() > kMaxSources) {
    throw ConfigError(
        {spec.loc.str() + ": node '" + name_ + "': " + std::to_string(spec.sources.size()) +
         " sources are more than a mix takes (" + std::to_string(kMaxSources) + ") mix fewer"});
  }
  sources_.resize(spec.sources.size());
  for (std::size_t k = 0; k < spec.sources.size(); ++k) {
    const SourceSpec& from = spec.sources[k];
    Source& s = sources_[k];
    s.spec.name = name_ + ".source" + std::to_string(k);
    s.spec.type = from.type;
    s.spec.declared_type = from.type;
    s.spec.role = Role::load;
    s.spec.params = from.params;
    s.spec.loc = from.loc.file.empty() ? spec.loc : from.loc;
    s.weight = from.keys.get_number("weight");
    s.label = "source " + std::to_string(k) + " (" + from.type + ")";
    s.full_label = mix_source_label(name_, k, from.type);
    if (!from.create) {
      throw ConfigError({s.spec.loc.str() + ": " + s.full_label +
                         ": the type is not resolved (was the config validated with this "
                         "registry?)"});
    }
    s.owner = as_source(s, [&] { return from.create(s.spec); });
    s.node = dynamic_cast<LoaderNode*>(s.owner.get());
    if (!s.node) {
      throw ConfigError({s.spec.loc.str() + ": " + s.full_label +
                         ": not a loader (a source must derive from LoaderNode)"});
    }
  }
  // One layout for every batch: every source must give the same tensors.
  std::vector<std::vector<TensorSpec>> given;
  for (Source& s : sources_) {
    given.push_back(as_source(s, [&] { return s.node->sample_tensors(); }));
  }
  tensors_ = given.front();
  for (std::size_t k = 1; k < given.size(); ++k) {
    const auto problem = [&](const std::string& what) {
      throw ConfigError({spec.loc.str() + ": node '" + name_ + "': sources 0 (" +
                         sources_[0].spec.type + ") and " + std::to_string(k) + " (" +
                         sources_[k].spec.type + ") give different samples: " + what +
                         " (a mix's batches have one layout) make every source give the same "
                         "tensors"});
    };
    for (const TensorSpec& t : tensors_) {
      auto it = std::find_if(given[k].begin(), given[k].end(),
                             [&](const TensorSpec& o) { return o.name == t.name; });
      if (it == given[k].end()) {
        problem("tensor '" + t.name + "' is " + describe(t) +
                " in source 0 and missing in source " + std::to_string(k));
      }
      if (it->dtype != t.dtype || it->shape != t.shape) {
        problem("tensor '" + t.name + "' is " + describe(t) + " in source 0 and " + describe(*it) +
                " in source " + std::to_string(k));
      }
    }
    for (const TensorSpec& t : given[k]) {
      auto it = std::find_if(tensors_.begin(), tensors_.end(),
                             [&](const TensorSpec& o) { return o.name == t.name; });
      if (it == tensors_.end()) {
        problem("tensor '" + t.name + "' is " + describe(t) + " in source " + std::to_string(k) +
                " and missing in source 0");
      }
    }
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      if (given[k][i].name != tensors_[i].name) {
        problem("tensor '" + tensors_[i].name + "' is tensor " + std::to_string(i) +
                " in source 0 and '" + given[k][i].name + "' is in source " + std::to_string(k));
      }
    }
  }
}

void MixLoader::setup(BuildContext& context) {
  batch_size_ = context.batch_size();
  for (const TensorSpec& t : tensors_) sample_bytes_.push_back(t.sample_bytes());
  std::vector<std::uint64_t> sizes;
  std::vector<double> weights;
  for (std::size_t k = 0; k < sources_.size(); ++k) {
    Source& s = sources_[k];
    MixSourceContext source_context(context, s.spec, k);
    as_source(s, [&] { s.node->setup(source_context); });
    sizes.push_back(as_source(s, [&] { return s.node->size(); }));
    if (sizes.back() == kUnknownSize) {
      throw ConfigError({s.spec.loc.str() + ": " + s.full_label +
                         ": a stream of unknown length cannot be mixed (a mix draws every "
                         "epoch from its sources' sizes) give the source its size (samples)"});
    }
    weights.push_back(s.weight);
    s.fills_rows = s.node->fill_rows(RowTarget{});
  }
  const SamplerOptions& sampler = context.sampler_options();
  try {
    order_ = std::make_unique<MixOrder>(plan_mix(sizes, weights, samples_), sizes, sampler.shuffle,
                                        sampler.seed);
  } catch (const std::invalid_argument& e) {
    throw ConfigError({loc_.str() + ": node '" + name_ + "': " + e.what()});
  }
  context.claim_memory(MemoryKind::pageable, 2 * order_->table_bytes() + order_->scratch_bytes(),
                       "the epoch tables (2 epochs of " +
                           std::to_string(order_->plan().epoch_size) + " positions, 5 bytes each)",
                       "nodes." + name_ + (samples_ ? ".params.samples" : ".sources"));
  tables_ = std::make_unique<MixTables>(*order_);
  drawn_ = std::make_unique<std::atomic<std::uint64_t>[]>(sources_.size());
  tier_ = context.output().tier;
  pool_ = &context.make_fill_pool(tier_ == Tier::staging ? "staging" : "host");
}

void MixLoader::begin_run() {
  for (std::size_t k = 0; k < sources_.size(); ++k) {
    drawn_[k] = 0;
    sources_[k].node->begin_run();
  }
}

void MixLoader::quiesce() noexcept {
  for (Source& s : sources_) s.node->quiesce();
}

std::unique_ptr<MixLoader::Work> MixLoader::take_work() {
  {
    std::lock_guard<std::mutex> lock(work_mutex_);
    if (!idle_work_.empty()) {
      std::unique_ptr<Work> w = std::move(idle_work_.back());
      idle_work_.pop_back();
      return w;
    }
  }
  // A body beyond those that ran before: its scratch, once.
  auto w = std::make_unique<Work>();
  w->samples.resize(sources_.size());
  w->rows.resize(sources_.size());
  w->kept.resize(sources_.size());
  for (std::size_t k = 0; k < sources_.size(); ++k) {
    w->samples[k].reserve(batch_size_);
    w->rows[k].reserve(batch_size_);
    w->batches.push_back(std::make_unique<Batch>());
    w->batches.back()->samples.reserve(batch_size_);
  }
  w->row_source.resize(batch_size_);
  w->row_sample.resize(batch_size_);
  w->row_index.resize(batch_size_);
  for (std::size_t r = 0; r < batch_size_; ++r) w->row_index[r] = static_cast<std::uint32_t>(r);
  w->bases.resize(tensors_.size());
  w->dropped.reserve(batch_size_);
  return w;
}

void MixLoader::give_back(std::unique_ptr<Work> work) {
  std::lock_guard<std::mutex> lock(work_mutex_);
  idle_work_.push_back(std::move(work));
}

void MixLoader::process(Batch& batch) {
  std::unique_ptr<Work> work = take_work();
  struct Return {
    MixLoader& mix;
    std::unique_ptr<Work>& work;
    ~Return() { mix.give_back(std::move(work)); }
  } give{*this, work};
  Work& w = *work;
  const std::size_t rows = batch.rows();
  for (std::size_t k = 0; k < sources_.size(); ++k) {
    w.samples[k].clear();
    w.rows[k].clear();
    w.kept[k] = 0;
  }
  {
    const MixTable& table = tables_->acquire(batch.epoch);
    for (std::size_t r = 0; r < rows; ++r) {
      const std::uint32_t at = batch.samples[r];
      const std::uint8_t k = table.source[at];
      w.row_source[r] = k;
      w.row_sample[r] = table.sample[at];
      ++w.kept[k];
      if (!sources_[k].fills_rows) {
        w.samples[k].push_back(table.sample[at]);
        w.rows[k].push_back(static_cast<std::uint32_t>(r));
      }
    }
    tables_->release(table);
  }
  batch.lease(tier_) = pool_->acquire();
  for (std::size_t t = 0; t < tensors_.size(); ++t) w.bases[t] = batch.tensor(tier_, t);
  w.dropped.clear();
  // Rows that fill in place are written in row order, a run of consecutive rows of one source at
  // a time: the buffer is written front to back (cheaper than a pass per source, each striding
  // over the others' rows), and a source may copy a run of consecutive samples as one block.
  for (std::size_t r = 0; r < rows;) {
    const std::uint8_t k = w.row_source[r];
    std::size_t end = r + 1;
    while (end < rows && w.row_source[end] == k) ++end;
    const Source& s = sources_[k];
    if (s.fills_rows) {
      const std::span<const std::uint32_t> samples(w.row_sample.data() + r, end - r);
      const std::span<const std::uint32_t> at(w.row_index.data() + r, end - r);
      as_source(s, [&] { return s.node->fill_rows(RowTarget{samples, at, w.bases, &batch}); });
    }
    r = end;
  }
  for (std::size_t k = 0; k < sources_.size(); ++k) {
    if (!w.samples[k].empty()) fill_by_process(k, batch, w);
  }
  if (!w.dropped.empty()) {
    if (w.dropped.size() == rows) {
      // Each source counted its own drops.
      throw BatchDroppedError("every sample of batch " + std::to_string(batch.seq) +
                              " was dropped by its source");
    }
    std::sort(w.dropped.begin(), w.dropped.end());
    remove_rows(batch, tier_, w.dropped);
  }
  for (std::size_t k = 0; k < sources_.size(); ++k) {
    drawn_[k].fetch_add(w.kept[k], std::memory_order_relaxed);
  }
}

void MixLoader::fill_by_process(std::size_t k, const Batch& batch, Work& w) {
  const Source& s = sources_[k];
  Batch& own = *w.batches[k];
  own.seq = batch.seq;
  own.epoch = batch.epoch;
  own.index_in_epoch = batch.index_in_epoch;
  own.layout = batch.layout;
  own.samples.assign(w.samples[k].begin(), w.samples[k].end());
  struct Reset {
    Batch& batch;
    ~Reset() { batch.reset(); }
  } reset{own};
  const std::vector<std::uint32_t>& asked = w.samples[k];
  try {
    as_source(s, [&] { s.node->process(own); });
  } catch (const BatchDroppedError&) {
    // The source dropped (and counted) all it was asked for; the other sources' rows stay.
    for (std::uint32_t row : w.rows[k]) w.dropped.push_back(row);
    w.kept[k] = 0;
    return;
  }
  if (!own.external.empty()) {
    throw Error(s.label + ": left bytes outside its buffer (a source of a mix fills its own)");
  }
  const Tier from = own.newest_tier();
  // A source that dropped samples (on_error: skip) kept the others in order.
  std::size_t j = 0;
  for (std::size_t i = 0; i < asked.size(); ++i) {
    const std::uint32_t row = w.rows[k][i];
    if (j < own.rows() && own.samples[j] == asked[i]) {
      for (std::size_t t = 0; t < tensors_.size(); ++t) {
        std::memcpy(w.bases[t] + row * sample_bytes_[t], own.tensor(from, t) + j * sample_bytes_[t],
                    sample_bytes_[t]);
      }
      ++j;
    } else {
      w.dropped.push_back(row);
      --w.kept[k];
    }
  }
}

void MixLoader::finish(RunReport& report) {
  double total_weight = 0;
  for (const Source& s : sources_) total_weight += s.weight;
  report.extra[name_ + ".epoch_samples"] = static_cast<double>(size());
  for (std::size_t k = 0; k < sources_.size(); ++k) {
    sources_[k].node->finish(report);
    const std::string at = name_ + ".source" + std::to_string(k);
    report.extra[at + ".samples"] = static_cast<double>(drawn_[k].load());
    report.extra[at + ".weight"] = sources_[k].weight / total_weight;
    report.extra[at + ".epoch_samples"] = static_cast<double>(order_->plan().counts[k]);
  }
}

}  // namespace

void register_mix(Registry& registry) {
  Schema schema;
  schema
      .add_string("epoch",
                  "when an epoch ends: first_exhausted (when the first source has given all its "
                  "samples) or samples (after `samples` positions, sources cycling)",
                  "first_exhausted")
      .one_of({"first_exhausted", "samples"});
  schema.add_int("samples", "positions per epoch with epoch: samples").range(1, 4294967295.0);
  NodeType t = factory_type(
      "mix", Role::load, std::move(schema),
      [](const NodeSpec& spec) { return std::make_unique<MixLoader>(spec); },
      "batches drawn from several loaders (sources:) in proportion to their weights; the source "
      "of each position is a pure function of (seed, epoch, position)");
  Schema keys;
  keys.add_number("weight", "the source's share of every epoch (relative to the others)", 1.0)
      .at_least(0);
  t.sources = std::move(keys);
  t.check = [](const NodeSpec& spec, const PipelineConfig& config) {
    std::vector<ConfigProblem> out;
    std::size_t i = 0;
    while (i < config.nodes.size() && &config.nodes[i] != &spec) ++i;
    const std::string at = "nodes[" + std::to_string(i) + "].params.";
    const bool by_samples = spec.params.get_string("epoch") == "samples";
    if (by_samples && !spec.params.has("samples")) {
      out.push_back({at + "epoch",
                     "samples needs the count (an epoch of how many positions?) "
                     "set params.samples"});
    } else if (!by_samples && spec.params.has("samples")) {
      out.push_back({at + "samples",
                     "is only read with epoch: samples (with first_exhausted the "
                     "sources' sizes set the epoch) set params.epoch: samples, "
                     "or remove samples"});
    }
    for (std::size_t k = 0; k < spec.sources.size(); ++k) {
      // An iterable gives its samples in its own order, whatever the mix asks for: only an
      // unshuffled mix asks each source for its samples in order.
      if (spec.sources[k].type == "python_iterable" && config.sampler.shuffle) {
        out.push_back(
            {"sampler.shuffle", "true does not fit source " + std::to_string(k) +
                                    " (python_iterable) of the mix '" + spec.name +
                                    "' (an iterable gives its samples in its own order) set "
                                    "sampler.shuffle: false, or use a map-style python source"});
      }
      const Params& keys = spec.sources[k].keys;
      if (keys.has("weight") && !(keys.get_number("weight") > 0)) {
        out.push_back({"nodes[" + std::to_string(i) + "].sources[" + std::to_string(k) + "].weight",
                       "0 gives the source no share (a weight must be above 0) raise it, or "
                       "remove the source"});
      }
    }
    return out;
  };
  registry.set(std::move(t));
}

}  // namespace flowfeed
