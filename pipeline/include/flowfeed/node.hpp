#pragma once
/// \file
/// The interface every node type implements, and what a node sees while the pipeline is built.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flowfeed/batch.hpp"
#include "flowfeed/build_plan.hpp"
#include "flowfeed/schema.hpp"

namespace flowfeed {

namespace detail {
class PipelineImpl;  ///< pipeline/src/detail/pipeline_impl.hpp (private)
}  // namespace detail

/// The place of a node in the chain load → transform* → staging → upload → transform* → train.
enum class Role { load, transform, staging, upload, train };
/// "load", "transform", "staging", "upload" or "train".
const char* role_name(Role role) noexcept;

/// The compute backend a pipeline runs on.
enum class Backend { host, cuda };

struct SamplerOptions;
struct PipelineOptions;
class Node;
struct NodeSpec;

/// One entry of a node's `sources:` list, for a type that combines loaders (NodeType::sources,
/// e.g. `mix`): a loader type, its params and the entry's own keys (e.g. `weight`).
struct SourceSpec {
  std::string type;  ///< the source's loader type
  Params params;     ///< its params, validated against that type's schema, defaults filled in
  /// The entry's other keys, validated against the combining type's NodeType::sources schema.
  Params keys;
  SourceLoc loc;  ///< where the entry was declared
  /// The source type's factory, set by validation from the registry.
  std::function<std::unique_ptr<Node>(const NodeSpec& spec)> create;
};

/// One node as declared in a config (or built in C++).
struct NodeSpec {
  std::string name;           ///< unique within the pipeline
  std::string type;           ///< the type that runs (after `device:` resolution)
  std::string declared_type;  ///< the type as written; equals `type` unless it was swapped
  Role role = Role::load;     ///< the type's role (validation sets it from the registry)
  int concurrency = 1;        ///< bodies that may run at once (1 = serial)
  /// `concurrency: auto`: the tuner sets the effective concurrency; the built node allows up to
  /// the thread budget (a train or asynchronous node stays at `concurrency`).
  bool auto_concurrency = false;
  int streams = 1;  ///< CUDA streams an upload node owns
  Params params;    ///< the type's params, validated against its schema, defaults filled in
  SourceLoc loc;    ///< where the node was declared
  /// The loaders this node combines (`sources:`); only a type with NodeType::sources takes them.
  std::vector<SourceSpec> sources;
};

/// Memory a staging or upload node can take a loader's batch in without copying it first (see
/// Port::in_place and BuildContext::make_fill_pool).
struct FillMemory {
  MemoryKind kind = MemoryKind::pageable;  ///< pinned for a CUDA staging or upload node
  Allocator allocator;                     ///< allocates one buffer (call note_allocation())
};

/// A node's port contract (Node::port): the memory it takes batches in and hands them on in,
/// beyond what its role says. The planner reads every node's once, before any setup(), walks the
/// chain and assigns each edge its memory (EdgeMemory, BuildPlan::memory); nodes then read their
/// edges from their context (BuildContext::input, output) instead of looking at batches.
struct Port {
  /// A loader: it fills the pool BuildContext::make_fill_pool makes, of the memory the plan
  /// assigns its output (BuildContext::output). False (the default): it hands batches on in host
  /// buffers of its own, of kind `own_memory`, and may not call make_fill_pool.
  bool fills = false;
  /// A loader that does not fill: the kind of the host buffers it hands batches on in (pinned for
  /// the `memory` loader's page-locked data set on CUDA).
  MemoryKind own_memory = MemoryKind::pageable;
  /// A staging or upload node: memory it takes a loader's batches in without a copy, or nullopt.
  /// When it is the first node after the loader that is not a transform and the loader fills,
  /// the loader fills buffers of this memory: the batches reach the node in Tier::staging and a
  /// staging node passes them through. A staging node's own buffers are of this kind (pageable
  /// when nullopt).
  std::optional<FillMemory> in_place;
  /// An upload node: it copies a batch's Batch::external ranges from where they are
  /// (Batch::for_each_piece) and clears them, so the edges to it may carry them.
  bool copies_external_bytes = false;
};

class LoaderNode;  ///< below
class BufferPool;  ///< pool.hpp
class Gauge;       ///< trace.hpp
struct RunReport;  ///< stats.hpp

/// What a node may use while the pipeline is built. Pools created here live as long as the
/// pipeline and appear in its report.
class BuildContext {
 public:
  /// Made by the pipeline for each node's setup(); valid only during that call.
  virtual ~BuildContext() = default;
  /// The node being set up, as validated (its name, params and declaration position).
  virtual const NodeSpec& spec() const = 0;
  /// The backend the pipeline resolved to (`pipeline.device`).
  virtual Backend backend() const = 0;
  /// The CUDA device ordinal: this node's branch's entry of `pipeline.devices`, else
  /// `pipeline.device_id` (stages before the upload node run on the first listed device).
  virtual int device_id() const = 0;
  /// How many copies of this node run side by side: the number of `pipeline.devices` branches for
  /// the upload node and the nodes after it, else 1. A node that keeps state which the copies
  /// would have to share (model weights) rejects more than one here.
  virtual int replicas() const { return 1; }
  /// Which copy this is, 0..replicas()-1; the branch takes the batches with seq % replicas() equal
  /// to it.
  virtual int replica() const { return 0; }
  /// Samples per batch (the last batch of an epoch may have fewer).
  virtual std::size_t batch_size() const = 0;
  /// The most batches that can be in flight at once (BuildPlan::prefetch_depth); size pools from
  /// this, never more. With `prefetch_depth: auto` it is solved after the loader's setup() (from
  /// its claims and the other nodes' plan()), so the loader's setup() may not ask for it
  /// (std::logic_error): it makes its per-batch pools with make_batch_pool() or make_fill_pool().
  virtual int prefetch_depth() const = 0;
  /// Where each tensor sits in a batch buffer; `layout().capacity()` is a full batch's bytes.
  virtual const BatchLayout& layout() const = 0;
  /// The pipeline's loader (e.g. for a checksum sink that knows how the loader fills samples).
  virtual const LoaderNode& loader() const = 0;
  /// The TBB worker threads that run node bodies (`pipeline.threads`, else the core count); 0
  /// when not known.
  virtual int threads() const { return 0; }
  /// The memory batches reach this node in: the plan's edge into it (BuildPlan::memory, decided
  /// from the nodes' ports before any setup). A staging or upload node decides here, once, what it
  /// does with every batch (pass it through, copy it, bounce it); a batch arrives as this says.
  /// The loader has none (std::logic_error). The default (outside a pipeline): pageable host.
  virtual const EdgeMemory& input() const;
  /// The memory this node hands batches on in. For a loader whose port fills
  /// (Port::fills): Tier::staging when the first node after it that is not a transform (a staging
  /// or upload node) takes batches in its own memory (Port::in_place), else Tier::host; put each
  /// lease of make_fill_pool() in `batch.lease(output().tier)`. `external` says whether it may
  /// leave bytes in page-locked memory of its own (a data file's registered mapping) and list
  /// them in `batch.external` instead of copying them into its buffer: true when its batches reach
  /// an upload node that copies such ranges with no transform before it and only staging nodes
  /// that pass them through; on CUDA each such byte is then read once, by the DMA, straight from
  /// where it is. The default (outside a pipeline): pageable host.
  virtual const EdgeMemory& output() const;
  /// For a loader whose port fills (Port::fills; std::logic_error otherwise): makes the pool it
  /// fills batches in, one buffer of layout().capacity() bytes per batch in flight (as
  /// make_batch_pool), of the memory output() names (pinned when a pinned_staging or cuda_upload
  /// follows, pageable host memory otherwise): bytes read into it are then written once on the
  /// host (by the read) and read once (by the device copy).
  virtual BufferPool& make_fill_pool(const std::string& name) {
    return make_batch_pool(name, MemoryKind::pageable, layout().capacity(), Allocator::host());
  }
  /// For a transform whose output tensors differ from its input (uint8 `x` in, float32 `x` out,
  /// written into a pool of its own): declares the layout its batches leave with and returns it,
  /// owned by the pipeline and valid as long as the pipeline. The nodes after this one get it
  /// from layout() (and size their pools from it); this node points `batch.layout` at it in
  /// process(), after moving its output buffer into the batch. The batch size stays the same.
  /// Call at most once, from setup(); anything but a transform gets std::logic_error.
  virtual const BatchLayout& change_layout(std::vector<TensorSpec> tensors);
  /// Creates a pool owned by the pipeline, of `count` buffers of `bytes` each. For the buffers a
  /// batch carries (one per batch in flight) use make_batch_pool() instead. The pool's
  /// `count × bytes` are first claimed against the memory the machine offers (see
  /// claim_memory), unless the allocator does not own its memory.
  virtual BufferPool& make_pool(const std::string& name, MemoryKind kind, std::size_t count,
                                std::size_t bytes, Allocator allocator) = 0;
  /// Creates the pool of a node's per-batch buffers: one buffer for every batch that can be in
  /// flight (prefetch_depth()), each `bytes` long (usually `layout().capacity()`). The pipeline
  /// owns the in-flight bound, so a stage never waits for or fails to get such a buffer. Such a
  /// pool scales with the depth; one made with make_pool() is fixed. A node after the loader
  /// declares both kinds in Node::plan() first. With `prefetch_depth: auto` the loader's pools
  /// are allocated once its setup() has returned and the depth is solved: it may keep the
  /// reference, and must not use the pool's buffers in setup().
  virtual BufferPool& make_batch_pool(const std::string& name, MemoryKind kind, std::size_t bytes,
                                      Allocator allocator);
  /// Claims `bytes` of `kind` memory that the node is about to allocate itself (a data set held
  /// whole), before it allocates it. `what` names it in a message ("the data set (60000
  /// samples)"), `keys` are the config keys that drive its size ("nodes[0].params.samples").
  /// Together with every pool it must fit in what the machine offers (memory_budget.hpp); else
  /// this throws ConfigError naming the keys, the bytes needed and available. The default accepts
  /// any claim.
  virtual void claim_memory(MemoryKind /*kind*/, std::uint64_t /*bytes*/,
                            const std::string& /*what*/, const std::string& /*keys*/) {}
  /// Batches per epoch for this rank. Not available to the loader's setup (it decides the size).
  virtual std::uint64_t batches_per_epoch() const = 0;
  /// True when the train node sees batches in sequence order (`pipeline.ordered`).
  virtual bool ordered() const = 0;
  /// Passes over the data set in one run (`pipeline.epochs`).
  virtual int epochs() const = 0;
  /// The sampler's options: with the loader's size and batch_size() they give every epoch's order
  /// (flowfeed::Sampler), e.g. for a train node that holds the whole data set (resident mode).
  virtual const SamplerOptions& sampler_options() const = 0;
  /// The `pipeline:` section as validated (config.hpp), e.g. `on_error` and `max_skipped` for a
  /// loader that drops a bad sample from its batch instead of failing the whole batch. The default
  /// implementation returns the defaults (`on_error: fail`).
  virtual const PipelineOptions& pipeline_options() const;
  /// A live figure called `name` (e.g. "loss") that the progress display shows while the pipeline
  /// runs; the same name gives the same gauge. It lives as long as the pipeline. The default
  /// implementation returns a gauge nobody reads.
  virtual Gauge& gauge(const std::string& name);
  /// A flag that becomes true while a run is being cancelled (request_abort, a stall timeout, or a
  /// failure in another node) and is cleared when the next run starts. It lives as long as the
  /// pipeline: a node keeps the reference, and a body that may block for long (a slow read, a
  /// wait) polls it and returns early, so that the run can end. Never set outside a pipeline.
  virtual const std::atomic<bool>& cancelled() const {
    static const std::atomic<bool> never{false};
    return never;
  }
};

/// What a node after the loader sees while the pipeline is planned (Node::plan), after the
/// loader's setup() and before any other node's. It declares the memory its setup() will claim,
/// so that the pipeline solves `prefetch_depth: auto` against the memory budget in closed form
/// before allocating anything: per-batch pools scale with the depth, the rest is fixed.
class PlanContext {
 public:
  virtual ~PlanContext() = default;
  /// The node being planned, as validated.
  virtual const NodeSpec& spec() const = 0;
  /// The backend the pipeline resolved to.
  virtual Backend backend() const = 0;
  /// Samples per batch.
  virtual std::size_t batch_size() const = 0;
  /// The layout batches have when they reach this node (after the layouts planned before it).
  virtual const BatchLayout& layout() const = 0;
  /// The pipeline's loader, set up already.
  virtual const LoaderNode& loader() const = 0;
  /// As BuildContext::input(): the memory batches reach this node in.
  virtual const EdgeMemory& input() const = 0;
  /// As BuildContext::threads().
  virtual int threads() const = 0;
  /// setup() will make a pool of one `bytes` buffer of `kind` per batch in flight
  /// (BuildContext::make_batch_pool).
  virtual void batch_pool(MemoryKind kind, std::uint64_t bytes) = 0;
  /// setup() will claim `bytes` of `kind` that do not scale with the depth (a make_pool() of a
  /// fixed count, or claim_memory()).
  virtual void fixed_memory(MemoryKind kind, std::uint64_t bytes) = 0;
  /// A transform whose setup() calls BuildContext::change_layout(tensors): the tensors its
  /// batches leave with, so that the nodes after it are planned with them. Returns that layout.
  virtual const BatchLayout& change_layout(std::vector<TensorSpec> tensors) = 0;
};

/// Completion handle passed to an AsynchronousNode: call it exactly once per batch, from any thread
/// (including a CUDA callback thread), with null on success or the failure. Cheap to copy.
class Completion {
 public:
  /// What the pipeline runs when the completion is called.
  using Fn = void (*)(void* context, Batch* batch, std::exception_ptr error) noexcept;
  /// An empty handle (calling it is a bug).
  Completion() = default;
  /// Completes the batch: null on success, else its failure. Once per batch, from any thread.
  void operator()(std::exception_ptr error = nullptr) const noexcept {
    fn_(context_, batch_, std::move(error));
  }
  /// The batch this handle completes.
  Batch* batch() const noexcept { return batch_; }

 private:
  // Made by the pipeline for one batch; a node never makes one.
  friend class detail::PipelineImpl;
  Completion(Fn fn, void* context, Batch* batch) : fn_(fn), context_(context), batch_(batch) {}
  Fn fn_ = nullptr;
  void* context_ = nullptr;
  Batch* batch_ = nullptr;
};

/// A pipeline stage. One object serves the whole run; process() may be called from several TBB
/// worker threads at once (up to the node's `concurrency`), so it must be thread-safe at that
/// concurrency. A node must not block waiting for another node, and must not call
/// tbb::flow::graph::wait_for_all.
class Node {
 public:
  /// Called when the pipeline is destroyed (after its last run; device work already quiesced).
  virtual ~Node() = default;
  /// Called once while the pipeline is planned, for every node after the loader, in chain order,
  /// before its setup(): declare the pools and memory setup() will claim and a changed layout
  /// (PlanContext). The default declares nothing: a pool that was not declared is still claimed
  /// against the memory budget in setup(), at the depth solved without it.
  virtual void plan(PlanContext& /*plan*/) const {}
  /// Called once while the pipeline is built, in chain order (the loader first). Allocate every
  /// buffer the node will need here, as the plan gives it; nothing may be allocated per batch.
  virtual void setup(BuildContext& /*context*/) {}
  /// The node's port contract: the memory it takes batches in and hands them on in (Port). Called
  /// once for every node, in chain order, before any node's plan() or setup(), with this node's
  /// context (its spec, backend, device, replicas; no layout, pools or edges yet). The default
  /// declares nothing: a loader that hands on pageable host buffers of its own, a node that takes
  /// nothing in place and copies no external ranges.
  virtual Port port(const BuildContext& /*context*/) const { return {}; }
  /// Called on every node at the start of every run, before the first batch (a pipeline may run
  /// several times, also after a failed or interrupted run): reset per-run state here.
  virtual void begin_run() {}
  /// Processes one batch. Throw to fail the batch (the run ends, or the batch is skipped under
  /// `on_error: skip`).
  virtual void process(Batch& batch) = 0;
  /// Called on the train node, from its own thread, after the last batch of an epoch has passed
  /// through it (a train node evaluates here).
  virtual void end_epoch(std::uint32_t /*epoch*/) {}
  /// Called after the graph has stopped, normally or after a failure, before buffers are reclaimed:
  /// wait here for device work that still reads or writes pool buffers. Must not throw.
  virtual void quiesce() noexcept {}
  /// Called once when the run ends normally; a node adds its figures to the report.
  virtual void finish(RunReport& /*report*/) {}
  /// True for nodes whose process() only starts work that completes later (see
  /// AsynchronousNode).
  virtual bool asynchronous() const noexcept { return false; }

  /// True for a node that keeps state from batch to batch which a checkpoint must carry (a model's
  /// weights and optimizer state): the pipeline then calls save_state() whenever it writes a
  /// checkpoint and load_state() when it resumes from one (docs/WRITING_NODES.md).
  virtual bool has_state() const noexcept { return false; }
  /// Appends the node's state to `out`, in the node's own (versioned) format. Called on the train
  /// node's thread between two batches (every batch it has processed is in the state; wait for
  /// the device here), or between runs.
  virtual void save_state(std::string& /*out*/) const {}
  /// Restores what save_state() wrote, after setup() and before the first run. Throw a
  /// std::exception saying what does not match (another model shape, a truncated state): the
  /// pipeline reports it as a ConfigError naming the checkpoint file.
  virtual void load_state(std::string_view /*state*/) {}
};

/// A node whose work completes outside the calling thread (a device copy). submit() must return
/// promptly without waiting for the work, and the completion must be called exactly once per
/// batch, on every path, including after a device error.
class AsynchronousNode : public Node {
 public:
  /// Always true: the pipeline calls submit(), not process().
  bool asynchronous() const noexcept final { return true; }
  /// Starts the work for `batch`; `done` is called when it completes.
  virtual void submit(Batch& batch, Completion done) = 0;
  /// Asks the node to complete every batch it holds back now. Only a train node is asked: one
  /// that completes batches in groups (one kernel launch for several batches) holds the newest
  /// ones while more are waiting to be submitted, and the pipeline calls flush() after a submit()
  /// whenever no further batch is waiting for the node (so groups form only while batches queue
  /// up for it, and a held batch never waits for one that a slow loader is still reading or that
  /// cannot come at all), and repeatedly, from another thread, while a run is being cancelled.
  /// flush() may run concurrently with submit() and with end_epoch() (which, for an asynchronous
  /// train node, runs on another thread after every batch of the epoch has completed); it must
  /// not throw (fail the held batches instead).
  virtual void flush() noexcept {}
  /// Synchronous use is not supported; the pipeline calls submit().
  void process(Batch& batch) final;
};

/// Rows of another loader's batch buffer that a loader writes its samples into
/// (LoaderNode::fill_rows): sample `samples[i]` goes to row `rows[i]`; tensor t's row r starts at
/// `tensors[t] + r × sample_bytes(t)` (the tensors of sample_tensors(), in order).
struct RowTarget {
  std::span<const std::uint32_t> samples;  ///< this loader's sample indices
  std::span<const std::uint32_t> rows;     ///< the row of each, as many as samples
  std::span<std::byte* const> tensors;     ///< where row 0 of each tensor is
  const Batch* batch = nullptr;            ///< the batch being filled (its seq and epoch)
};

/// The size of a data set whose length is not known ahead: a stream (LoaderNode::size() may
/// return it). Its epochs end where the loader finds the end of its data (Batch::end_of_data).
inline constexpr std::size_t kUnknownSize = std::numeric_limits<std::size_t>::max();

/// The loader: it owns the dataset's size and sample layout and fills a batch's host buffer.
/// The sampler (built into the pipeline's source) decides which samples form each batch.
class LoaderNode : public Node {
 public:
  /// Number of samples in the dataset, or kUnknownSize for a stream whose length
  /// is learned only at its end: every epoch then reads it from its start, in order, and the
  /// loader marks the batch where its data ended (Batch::end_of_data).
  virtual std::size_t size() const = 0;
  /// The tensors of one sample, in buffer order (e.g. x then y).
  virtual std::vector<TensorSpec> sample_tensors() const = 0;
  /// A batch size the loader's own params ask for (e.g. synthetic.batch_size), or 0.
  virtual std::size_t preferred_batch_size() const { return 0; }
  /// Where the loader's data shards (its files) begin: the index of the first sample of each, in
  /// shard order, rising (an empty shard may repeat its successor's start; the first may be left
  /// out: it is 0). A shard's samples are consecutive indices, read from one open file.
  /// `sampler.order: shards` permutes these shards and reads each whole. Empty (the default): the
  /// data set is one shard. Read after setup(), as size() is.
  virtual std::vector<std::size_t> shard_starts() const { return {}; }
  /// For a loader that is a source of another (a `mix`): writes the target's samples straight
  /// into the target's rows, in another loader's buffer, and returns true; called after setup(),
  /// at the node's concurrency, like process(), and throws as process() would. Returns false
  /// without writing (the default) when the loader has no such path: the caller then runs
  /// process() on a batch of the loader's own and copies the rows. A target without samples
  /// only asks which it is.
  virtual bool fill_rows(const RowTarget& /*target*/) { return false; }
};

}  // namespace flowfeed
