#include "flowfeed/testing/fault_nodes.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "flowfeed/error.hpp"
#include "flowfeed/nodes/detail/host_copy.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "flowfeed/pool.hpp"

namespace flowfeed {

namespace {

const std::atomic<bool>& never_cancelled() {
  static const std::atomic<bool> never{false};
  return never;
}

}  // namespace

FaultInjector::FaultInjector(FaultOptions options, std::string type)
    : options_(std::move(options)), type_(std::move(type)), cancelled_(&never_cancelled()) {}

bool FaultInjector::hits(const Batch& batch) noexcept {
  const auto seq = static_cast<std::int64_t>(batch.seq);
  if (seq < options_.at_batch || seq >= options_.at_batch + options_.count) return false;
  if (options_.fires == 0) return true;
  return fired_.fetch_add(1) < options_.fires;
}

std::exception_ptr FaultInjector::error(const Batch& batch) const {
  const std::string at = "batch " + std::to_string(batch.seq);
  if (options_.mode == FaultMode::data_error) {
    // The offset a real loader would name: where the batch's first sample starts in the file.
    const std::size_t sample_bytes = batch.layout && !batch.layout->tensors().empty()
                                         ? batch.layout->tensors()[0].sample_bytes()
                                         : 0;
    const std::size_t offset = batch.samples.empty() ? 0 : batch.samples[0] * sample_bytes;
    return std::make_exception_ptr(DataError(options_.file + ": short read at offset " +
                                             std::to_string(offset) + " (injected by " + type_ +
                                             " at " + at + ")"));
  }
  return std::make_exception_ptr(std::runtime_error(type_ + ": injected failure at " + at));
}

void FaultInjector::stall() const noexcept {
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(options_.stall_s));
  // Small slices, so that a cancelled run ends within milliseconds of the cancellation.
  while (Clock::now() < end && !cancelled_->load(std::memory_order_relaxed)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void FaultInjector::corrupt(Batch& batch, Tier tier) noexcept {
  std::byte* x = batch.tensor(tier, 0);
  if (x && batch.rows() > 0) *x ^= std::byte{0xFF};
}

void FaultInjector::apply(Batch& batch, Tier tier) {
  if (!hits(batch)) return;
  switch (options_.mode) {
    case FaultMode::fail:
    case FaultMode::data_error: std::rethrow_exception(error(batch));
    case FaultMode::stall: stall(); break;
    case FaultMode::corrupt: corrupt(batch, tier); break;
  }
}

FaultOptions fault_options_from(const Params& params) {
  FaultOptions o;
  const std::string& mode = params.get_string("mode");
  o.mode = mode == "data_error" ? FaultMode::data_error
           : mode == "corrupt"  ? FaultMode::corrupt
           : mode == "stall"    ? FaultMode::stall
                                : FaultMode::fail;
  o.at_batch = params.get_int("at_batch");
  o.count = params.get_int("count");
  o.fires = params.get_int("fires");
  o.stall_s = params.get_number("stall_s");
  o.file = params.get_string("file");
  if (params.has("in_submit")) o.in_submit = params.get_bool("in_submit");
  return o;
}

namespace {

/// The synthetic loader with a fault: `throw`/`data_error` fail the read, `stall` delays it,
/// `corrupt` damages what was read. Its bytes follow the synthetic formula, so checksum sinks
/// verify them.
class FaultLoader final : public LoaderNode, public SyntheticContent {
 public:
  FaultLoader(SyntheticOptions synthetic, FaultOptions fault, std::string open_in_setup)
      : inner_(std::move(synthetic)),
        fault_(std::move(fault), "fault_load"),
        open_in_setup_(std::move(open_in_setup)) {}
  void setup(BuildContext& context) override {
    if (!open_in_setup_.empty()) {
      // A blocking open, as of a file on a hung network mount: a FIFO nobody writes to holds the
      // build here (the runner's signal tests interrupt it).
      const int fd = ::open(open_in_setup_.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) ::close(fd);
    }
    inner_.setup(context);
    fault_.bind(context);
  }
  void process(Batch& batch) override {
    if (!fault_.hits(batch)) {
      inner_.process(batch);
      return;
    }
    switch (fault_.options().mode) {
      case FaultMode::fail:
      case FaultMode::data_error: std::rethrow_exception(fault_.error(batch));
      case FaultMode::stall:
        fault_.stall();
        inner_.process(batch);
        break;
      case FaultMode::corrupt:
        inner_.process(batch);
        FaultInjector::corrupt(batch, Tier::host);
        break;
    }
  }
  std::size_t size() const override { return inner_.size(); }
  std::vector<TensorSpec> sample_tensors() const override { return inner_.sample_tensors(); }
  std::size_t preferred_batch_size() const override { return inner_.preferred_batch_size(); }
  const SyntheticOptions& synthetic_options() const noexcept override {
    return inner_.synthetic_options();
  }

 private:
  SyntheticLoader inner_;
  FaultInjector fault_;
  std::string open_in_setup_;
};

/// fault_transform and fault_train: passes batches through unchanged (or, as a sink, does
/// nothing with them), but for the faulty one. `type` names the node type in its errors.
class FaultPassThrough final : public Node {
 public:
  FaultPassThrough(FaultOptions fault, const char* type) : fault_(std::move(fault), type) {}
  void setup(BuildContext& context) override { fault_.bind(context); }
  void process(Batch& batch) override { fault_.apply(batch, batch.newest_tier()); }

 private:
  FaultInjector fault_;
};

/// host_staging with a fault: copies into its own pool, then applies the fault to the copy.
class FaultStaging final : public Node {
 public:
  explicit FaultStaging(FaultOptions fault) : fault_(std::move(fault), "fault_staging") {}
  void setup(BuildContext& context) override {
    fault_.bind(context);
    copy_.setup(context);
  }
  void process(Batch& batch) override {
    copy_.copy(batch);
    fault_.apply(batch, Tier::staging);
  }

 private:
  FaultInjector fault_;
  HostCopy copy_{Tier::staging};
};

/// An asynchronous upload (the shape of cuda_upload) with a fault. A good batch is copied and
/// completed at once; `throw`/`data_error` fail the completion (as a device error does), or throw
/// from submit() with `in_submit: true`; `stall` completes from another thread after stall_s, or
/// when the run is cancelled, as a device completion that is late.
class FaultUpload final : public AsynchronousNode {
 public:
  explicit FaultUpload(FaultOptions fault) : fault_(std::move(fault), "fault_upload") {}
  ~FaultUpload() override { join_stallers(); }
  void setup(BuildContext& context) override {
    fault_.bind(context);
    copy_.setup(context);
  }
  void submit(Batch& batch, Completion done) override {
    const bool hit = fault_.hits(batch);
    const FaultMode mode = fault_.options().mode;
    if (hit && (mode == FaultMode::fail || mode == FaultMode::data_error)) {
      if (fault_.options().in_submit) std::rethrow_exception(fault_.error(batch));
      done(fault_.error(batch));
      return;
    }
    copy_.copy(batch);
    if (hit && mode == FaultMode::corrupt) FaultInjector::corrupt(batch, Tier::device);
    if (hit && mode == FaultMode::stall) {
      std::lock_guard<std::mutex> lock(mutex_);
      stallers_.emplace_back([this, done] {
        fault_.stall();
        done();
      });
      return;
    }
    done();
  }
  void quiesce() noexcept override { join_stallers(); }

 private:
  void join_stallers() noexcept {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      threads.swap(stallers_);
    }
    for (auto& t : threads) t.join();
  }

  FaultInjector fault_;
  HostCopy copy_{Tier::device};
  std::mutex mutex_;
  std::vector<std::thread> stallers_;
};

void add_fault_params(Schema& schema, std::vector<std::string> modes) {
  schema.add_string("mode", "what the fault does to a faulty batch")
      .one_of(std::move(modes))
      .make_required();
  schema.add_int("at_batch", "sequence number of the first faulty batch (across epochs)", 0)
      .range(0, 1e15);
  schema.add_int("count", "consecutive faulty batches from at_batch", 1).range(1, 1e15);
  schema.add_int("fires", "faults over the node's life (0: no limit)", 0).range(0, 1e15);
  schema.add_number("stall_s", "how long a stall lasts (it ends when the run is cancelled)", 60.0)
      .range(0, 1e6);
  schema.add_string("file", "the file a data error names", std::string("fault.bin"));
}

NodeType fault_type(std::string name, Role role, std::string doc, bool corrupt = true) {
  NodeType t;
  t.name = std::move(name);
  t.role = role;
  t.doc = "test only: " + std::move(doc);
  t.backend = TypeBackend::host;
  std::vector<std::string> modes = {"throw", "data_error", "stall"};
  if (corrupt) modes.push_back("corrupt");
  add_fault_params(t.schema, std::move(modes));
  return t;
}

}  // namespace

void register_fault_nodes(Registry& registry) {
  {
    NodeType t = fault_type("fault_load", Role::load,
                            "the synthetic loader (same params, same data) with a fault");
    add_synthetic_content_params(t.schema, /*delay=*/true);
    t.schema.add_string("open_in_setup",
                        "a file opened for reading (blocking) in setup: a FIFO nobody writes to "
                        "holds the build",
                        std::string());
    t.create = [](const NodeSpec& spec) {
      return std::make_unique<FaultLoader>(SyntheticLoader::options_from(spec.params),
                                           fault_options_from(spec.params),
                                           spec.params.get_string("open_in_setup"));
    };
    registry.set(std::move(t));
  }
  {
    NodeType t =
        fault_type("fault_transform", Role::transform, "passes batches through, with a fault");
    t.create = [](const NodeSpec& spec) {
      return std::make_unique<FaultPassThrough>(fault_options_from(spec.params), "fault_transform");
    };
    registry.set(std::move(t));
  }
  {
    NodeType t = fault_type("fault_staging", Role::staging, "host_staging with a fault");
    t.create = [](const NodeSpec& spec) {
      return std::make_unique<FaultStaging>(fault_options_from(spec.params));
    };
    registry.set(std::move(t));
  }
  {
    NodeType t = fault_type("fault_upload", Role::upload,
                            "an asynchronous host upload (completion API) with a fault");
    t.schema.add_bool("in_submit", "throw from submit() instead of failing the completion", false);
    t.create = [](const NodeSpec& spec) {
      return std::make_unique<FaultUpload>(fault_options_from(spec.params));
    };
    registry.set(std::move(t));
  }
  {
    NodeType t = fault_type("fault_train", Role::train, "a sink that does nothing, with a fault",
                            /*corrupt=*/false);
    t.create = [](const NodeSpec& spec) {
      return std::make_unique<FaultPassThrough>(fault_options_from(spec.params), "fault_train");
    };
    registry.set(std::move(t));
  }
}

}  // namespace flowfeed
