// Plan, then allocate, for memory: the planner reads every node's port once and gives each edge of
// the chain its memory (BuildPlan::memory); the staging and upload nodes act on it for every batch
// without looking at the batch. A wrong decision shows as bytes that do not arrive, or a copy
// where a pass-through was planned (the staging node's counters).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"
#include "tests/error_of.hpp"
#include "tests/nodes/npy_storage_fixture.hpp"

namespace flowfeed {

void PrintTo(const EdgeMemory& e, std::ostream* os) {
  static const char* const tiers[] = {"host", "staging", "device"};
  *os << "{" << tiers[static_cast<int>(e.tier)] << ", " << memory_kind_name(e.kind)
      << (e.external ? ", external" : "") << "}";
}

namespace {

using namespace testing_files;

constexpr EdgeMemory kHost{Tier::host, MemoryKind::pageable, false};
constexpr EdgeMemory kHostPinned{Tier::host, MemoryKind::pinned, false};
constexpr EdgeMemory kStaging{Tier::staging, MemoryKind::pageable, false};
// The edges from a loader to an upload node that copies external ranges, through staging nodes
// that pass batches through, may carry them (each batch's list says which bytes).
constexpr EdgeMemory kHostExternal{Tier::host, MemoryKind::pageable, true};
constexpr EdgeMemory kStagingExternal{Tier::staging, MemoryKind::pageable, true};
constexpr EdgeMemory kDevice{Tier::device, MemoryKind::device, false};

/// A loader whose port says where its batches leave: in the plan's memory (`fills`), or in host
/// buffers of its own of `own_memory`. x is float32 [5] by the synthetic formula (seed 3), y the
/// sample's index.
class PortLoader final : public LoaderNode {
 public:
  explicit PortLoader(Port port) : port_(std::move(port)) {}
  Port port(const BuildContext& /*context*/) const override { return port_; }
  void setup(BuildContext& context) override {
    tier_ = context.output().tier;
    pool_ = port_.fills ? &context.make_fill_pool("fill")
                        : &context.make_batch_pool("own", port_.own_memory,
                                                   context.layout().capacity(), Allocator::host());
  }
  void process(Batch& batch) override {
    batch.lease(tier_) = pool_->acquire();
    auto* x = reinterpret_cast<float*>(batch.tensor(tier_, 0));
    auto* y = reinterpret_cast<std::int32_t*>(batch.tensor(tier_, 1));
    for (std::size_t r = 0; r < batch.rows(); ++r) {
      synthetic_fill(3, batch.samples[r], DType::float32, 5, x + r * 5);
      y[r] = static_cast<std::int32_t>(batch.samples[r]);
    }
  }
  std::size_t size() const override { return 40; }
  std::vector<TensorSpec> sample_tensors() const override {
    return {TensorSpec{"x", DType::float32, {5}}, TensorSpec{"y", DType::int32, {}}};
  }

 private:
  Port port_;
  Tier tier_ = Tier::host;
  BufferPool* pool_ = nullptr;
};

Registry port_registry(std::shared_ptr<Captured> seen) {
  Registry registry = builtin_registry();
  Port fills;
  fills.fills = true;
  Port pinned;
  pinned.own_memory = MemoryKind::pinned;
  for (const auto& [name, port] :
       {std::pair{"fills", fills}, std::pair{"own_pinned", pinned}, std::pair{"own", Port{}}}) {
    registry.add(factory_type(std::string("port_") + name, Role::load, {}, [port](const NodeSpec&) {
      return std::make_unique<PortLoader>(port);
    }));
  }
  register_capture(registry, std::move(seen));
  return registry;
}

/// Every sample of both epochs arrived once per epoch with its bytes.
void expect_every_byte(const Captured& seen) {
  std::vector<int> count(40, 0);
  for (std::size_t b = 0; b < seen.samples.size(); ++b) {
    for (std::size_t r = 0; r < seen.samples[b].size(); ++r) {
      const std::uint32_t s = seen.samples[b][r];
      ASSERT_LT(s, 40u);
      ++count[s];
      float want[5];
      synthetic_fill(3, s, DType::float32, 5, want);
      ASSERT_EQ(std::memcmp(seen.x[b].data() + r * sizeof want, want, sizeof want), 0)
          << "batch " << b << " row " << r << " sample " << s;
      ASSERT_EQ(seen.y[b][r], static_cast<std::int32_t>(s));
    }
  }
  for (std::size_t s = 0; s < count.size(); ++s) EXPECT_EQ(count[s], 2) << "sample " << s;
}

struct ChainCase {
  const char* name;
  std::string loader;
  std::string middle;  // the nodes between the loader and the upload
  std::vector<EdgeMemory> memory;
  double copied_batches;  // by host_staging; -1 when there is none
};

TEST(EdgeMemory, EachEdgeGetsItsMemoryFromThePortsAndEveryByteArrives) {
  const std::vector<ChainCase> cases = {
      // The loader fills host_staging's memory: staging passes every batch through.
      {"fills_then_staging",
       "port_fills",
       "  - { name: stage, type: host_staging }\n",
       {kStagingExternal, kStagingExternal, kDevice, kDevice},
       0},
      // A transform between them works on the tier the loader filled; no external range passes
      // a transform.
      {"fills_transform_staging",
       "port_fills",
       "  - { name: wait, type: delay, params: { ms: 0 } }\n"
       "  - { name: stage, type: host_staging }\n",
       {kStaging, kStaging, kStaging, kDevice, kDevice},
       0},
      // host_upload takes nothing in place: the loader fills pageable host memory.
      {"fills_no_staging", "port_fills", "", {kHostExternal, kDevice, kDevice}, -1},
      // Buffers of the loader's own, page-locked or not: host_staging copies them.
      {"own_pinned_then_staging",
       "port_own_pinned",
       "  - { name: stage, type: host_staging }\n",
       {kHostPinned, kStaging, kDevice, kDevice},
       10},
      {"own_then_staging",
       "port_own",
       "  - { name: stage, type: host_staging }\n",
       {kHost, kStaging, kDevice, kDevice},
       10},
      {"synthetic_then_staging",
       "synthetic, params: { samples: 40, sample_shape: [5] }",
       "  - { name: stage, type: host_staging }\n",
       {kHost, kStaging, kDevice, kDevice},
       10},
  };
  for (const ChainCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto seen = std::make_shared<Captured>();
    Registry registry = port_registry(seen);
    Pipeline pipeline(
        load_config_string("pipeline: { epochs: 2, batch_size: 8, prefetch_depth: 3, device: host, "
                           "threads: 2 }\n"
                           "nodes:\n"
                           "  - { name: load, concurrency: 2, type: " +
                               c.loader + " }\n" + c.middle +
                               "  - { name: upload, type: host_upload }\n"
                               "  - { name: train, type: capture }\n",
                           registry),
        registry);
    EXPECT_EQ(pipeline.plan().memory, c.memory);
    const RunReport report = pipeline.run();
    EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
    EXPECT_EQ(report.allocations_after_build, 0u);
    if (c.loader.rfind("synthetic", 0) != 0) expect_every_byte(*seen);
    if (c.copied_batches >= 0) {
      EXPECT_EQ(extra(report, "stage.passed_through_batches"), 10 - c.copied_batches);
      const double batch_bytes = 256 + 32;  // x (8 × 5 float32, padded to 256) then y
      EXPECT_EQ(extra(report, "stage.copied_bytes"), c.copied_batches * batch_bytes);
    }
  }
}

TEST(EdgeMemory, OnlyALoaderWhosePortFillsMayMakeTheFillPool) {
  class Sneaky final : public LoaderNode {
   public:
    void setup(BuildContext& context) override { context.make_fill_pool("fill"); }
    void process(Batch&) override {}
    std::size_t size() const override { return 8; }
    std::vector<TensorSpec> sample_tensors() const override {
      return {TensorSpec{"x", DType::uint8, {4}}};
    }
  };
  Registry registry = builtin_registry();
  registry.add(node_type<Sneaky>("sneaky", Role::load));
  const std::string message = error_of<NodeError>([&] {
    Pipeline(load_config_string("pipeline: { batch_size: 4, device: host }\n"
                                "nodes:\n"
                                "  - { name: load, type: sneaky }\n"
                                "  - { name: stage, type: host_staging }\n"
                                "  - { name: upload, type: host_upload }\n"
                                "  - { name: train, type: discard }\n",
                                registry),
             registry);
  });
  EXPECT_EQ(message,
            "node 'load' (sneaky, <string>:3): make_fill_pool is for the setup of a loader whose "
            "port fills (Port::fills in Node::port)");
}

/// A loader that may leave bytes where they are (npy, pin: true) legitimately hands on some
/// batches with external ranges and some without, in one run: the plan decides once that the
/// edges to the upload carry them (EdgeMemory::external); each batch's list says which bytes.
/// Shards of 3, 5 and 16 rows of 80,000 bytes, read in order 8 rows a batch: batch 0 is runs of 3
/// and 5 rows (under 512 KiB: copied into the buffer), batches 1 and 2 one run of 8 (in place).
TEST_F(NpyStorageTest, ThePlanLetsSomeBatchesCarryExternalRangesAndEveryByteArrives) {
  constexpr double kRow = 80000;
  write_shards({3, 5, 16}, 80000);
  for (const char* stages : {"host_staging", ""}) {
    SCOPED_TRACE(std::string("stages: ") + stages);
    seen_ = std::make_shared<Captured>();
    Registry registry = builtin_registry();
    register_capture(registry, seen_);
    Pipeline pipeline(
        load_config_string(chain(glob_params(", io: mmap, pin: true"), "shuffle: false", stages),
                           registry),
        registry);
    const std::vector<EdgeMemory> planned =
        *stages ? std::vector<EdgeMemory>{kStagingExternal, kStagingExternal, kDevice, kDevice}
                : std::vector<EdgeMemory>{kHostExternal, kDevice, kDevice};
    EXPECT_EQ(pipeline.plan().memory, planned);
    const RunReport report = pipeline.run();
    const std::vector<std::uint32_t> order = check_bytes();
    ASSERT_EQ(order.size(), 48u);
    for (std::size_t i = 0; i < order.size(); ++i) ASSERT_EQ(order[i], i % 24);
    EXPECT_EQ(extra(report, "load.in_place_bytes"), 2 * 16 * kRow);
    EXPECT_EQ(extra(report, "load.io_bytes"), 2 * 8 * kRow);
    if (*stages) {
      EXPECT_EQ(extra(report, "stage.passed_through_batches"), 6.0);
      EXPECT_EQ(extra(report, "stage.copied_bytes"), 0.0);
    }
    EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
  }
}

}  // namespace
}  // namespace flowfeed
