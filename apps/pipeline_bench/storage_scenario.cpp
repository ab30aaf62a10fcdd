// pipeline_bench storage: a .npy data set on disk through npy → staging → upload, cold and warm,
// with pread and io_uring, each beside its baseline measured in the same process just before:
// cold (page cache evicted with posix_fadvise) against raw parallel O_DIRECT reads of the same
// file, warm against the `memory` loader's pageable in-memory path of the same bytes.
#include <fcntl.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/enumerable_thread_specific.h>
#include <oneapi/tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "bench.hpp"
#include "flowfeed/nodes/detail/npy_file.hpp"

namespace flowfeed::bench {

namespace {

namespace fs = std::filesystem;

constexpr std::size_t kAlign = 4096;
constexpr std::size_t kBlock = std::size_t{8} << 20;  // raw reads: 8 MiB each

struct AlignedBuffer {
  explicit AlignedBuffer(std::size_t bytes)
      : data(static_cast<std::byte*>(::operator new (bytes, std::align_val_t{kAlign}))) {}
  ~AlignedBuffer() { ::operator delete (data, std::align_val_t{kAlign}); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::byte* data;
};

/// The data set: float32 features [rows, row_bytes / 4] behind a 4 KiB header (so O_DIRECT
/// reads land in place), int32 labels row % 10.
struct DataSet {
  std::string features;
  std::string labels;
  std::size_t rows = 0;
  std::size_t row_bytes = 0;
  std::uint64_t payload = 0;  // feature bytes
};

DataSet write_data_set(const fs::path& dir, std::uint64_t bytes, std::size_t row_bytes) {
  DataSet d;
  d.row_bytes = row_bytes;
  d.rows = static_cast<std::size_t>(std::max<std::uint64_t>(1, bytes / row_bytes));
  d.payload = static_cast<std::uint64_t>(d.rows) * row_bytes;
  fs::create_directories(dir);
  d.features = (dir / "features.npy").string();
  d.labels = (dir / "labels.npy").string();
  const std::string header = npy_header(
      NpyDtype::float32,
      {static_cast<std::int64_t>(d.rows), static_cast<std::int64_t>(row_bytes / 4)}, kAlign);
  std::error_code ec;
  if (fs::file_size(d.features, ec) == header.size() + d.payload && fs::exists(d.labels)) {
    std::printf("storage: reusing %s (%.2f GiB)\n", d.features.c_str(),
                static_cast<double>(d.payload) / (1 << 30));
    return d;
  }
  const int fd = ::open(d.features.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno("storage: cannot create", d.features);
  auto write_all = [&](const void* src, std::size_t n) {
    const auto* p = static_cast<const char*>(src);
    while (n > 0) {
      const ssize_t k = ::write(fd, p, n);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) fail_errno("storage: cannot write", d.features);
      p += k;
      n -= static_cast<std::size_t>(k);
    }
  };
  write_all(header.data(), header.size());
  const std::size_t chunk_rows = std::max<std::size_t>(1, (std::size_t{64} << 20) / row_bytes);
  std::vector<float> chunk(chunk_rows * row_bytes / 4);
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t first = 0; first < d.rows; first += chunk_rows) {
    const std::size_t n = std::min(chunk_rows, d.rows - first);
    for (std::size_t i = 0; i < n * row_bytes / 4; ++i) {
      chunk[i] = static_cast<float>(first * (row_bytes / 4) + i);
    }
    write_all(chunk.data(), n * row_bytes);
  }
  // Written back before any eviction: posix_fadvise drops clean pages only.
  if (::fdatasync(fd) != 0 || ::close(fd) != 0) fail_errno("storage: cannot write", d.features);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<std::int32_t> labels(d.rows);
  for (std::size_t i = 0; i < d.rows; ++i) labels[i] = static_cast<std::int32_t>(i % 10);
  write_npy(d.labels, NpyDtype::int32, {static_cast<std::int64_t>(d.rows)}, labels.data());
  std::printf("storage: wrote %s, %.2f GiB in %.1f s\n", d.features.c_str(),
              static_cast<double>(d.payload) / (1 << 30), seconds);
  return d;
}

/// Drops the file's pages from the page cache.
void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno("storage: cannot open", path);
  ::fdatasync(fd);
  const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (rc != 0) {
    errno = rc;
    fail_errno("storage: posix_fadvise(DONTNEED) failed on", path);
  }
}

/// Reads [offset, offset + bytes) of `path` in 8 MiB blocks in parallel on the TBB workers
/// (O_DIRECT when `direct`: the fio-style ceiling of the storage); returns GB/s.
double parallel_read_gbps(const std::string& path, std::uint64_t offset, std::uint64_t bytes,
                          bool direct) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd < 0)
    fail_errno(direct ? "storage: cannot open with O_DIRECT" : "storage: cannot open", path);
  tbb::enumerable_thread_specific<std::unique_ptr<AlignedBuffer>> buffers;
  std::atomic<bool> failed{false};
  const std::size_t blocks = static_cast<std::size_t>((bytes + kBlock - 1) / kBlock);
  const auto start = std::chrono::steady_clock::now();
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, blocks, 1),
      [&](const tbb::blocked_range<std::size_t>& r) {
        auto& buffer = buffers.local();
        if (!buffer) buffer = std::make_unique<AlignedBuffer>(kBlock);
        for (std::size_t b = r.begin(); b != r.end(); ++b) {
          const std::uint64_t at = offset + b * kBlock;
          std::size_t want =
              static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, offset + bytes - at));
          // O_DIRECT reads whole blocks: round the last one up (the read stops at the end).
          if (direct) want = (want + kAlign - 1) / kAlign * kAlign;
          const ssize_t got = ::pread(fd, buffer->data, want, static_cast<off_t>(at));
          if (got <= 0) failed = true;
        }
      },
      tbb::simple_partitioner());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::close(fd);
  if (failed) throw std::runtime_error("storage: a raw read of " + path + " failed");
  return static_cast<double>(bytes) / seconds * 1e-9;
}

std::string npy_yaml(const DataSet& d, const Options& o, int loaders, const std::string& io,
                     bool direct, int epochs) {
  return "pipeline: { epochs: " + std::to_string(epochs) +
         ", batch_size: " + std::to_string(o.storage_batch) +
         ", prefetch_depth: " + std::to_string(loaders * 2) +
         ", device: auto }\n"
         "nodes:\n"
         "  - name: load\n"
         "    type: npy\n"
         "    concurrency: " +
         std::to_string(loaders) + "\n    params: { features: '" + d.features + "', labels: '" +
         d.labels + "', io: " + io + ", direct: " + (direct ? "true" : "false") +
         ", read_bytes: 4194304, queue_depth: 32 }\n"
         "  - { name: stage, type: pinned_staging }\n"
         "  - { name: upload, type: cuda_upload }\n"
         "  - { name: train, type: device_discard }\n";
}

/// Pool bytes of a run: the host memory the pipeline holds, whatever the data set's size.
double pool_mib(const RunReport& r) {
  double bytes = 0;
  for (const auto& p : r.pools) bytes += static_cast<double>(p.bytes);
  return bytes / (1 << 20);
}

/// The warm runs of one I/O setting at each loader concurrency of the sweep; the row `name` gets
/// the best, details `<name without storage_>` its report and `<...>_loaders<N>` each run's.
RunReport warm_sweep(Bench& bench, const DataSet& d, const Options& o, const std::string& io,
                     int epochs, double memory_gbps, const std::string& name,
                     nlohmann::json& details) {
  std::vector<int> sweep = o.storage_warm_loaders;
  if (sweep.empty()) sweep.push_back(o.storage_loaders);
  const std::string key = name.substr(std::string("storage_").size());
  RunReport best;
  int best_loaders = 0;
  for (int loaders : sweep) {
    const PipelineConfig config =
        load_config_string(npy_yaml(d, o, loaders, io, false, epochs), bench.registry(), {}, name);
    const RunReport warm = Pipeline(config, bench.registry()).run();
    print_run(("npy warm, page cache, " + io + ", " + std::to_string(loaders) + " loaders").c_str(),
              warm);
    if (sweep.size() > 1) {
      details[key + "_loaders" + std::to_string(loaders)] = nlohmann::json::parse(warm.to_json());
    }
    if (best_loaders == 0 || warm.upload_gbps > best.upload_gbps) {
      best = warm;
      best_loaders = loaders;
    }
  }
  bench.result(name, best.upload_gbps, "GB/s", memory_gbps, Target{0.9, true, false});
  details[key] = nlohmann::json::parse(best.to_json());
  details[key + "_loaders"] = best_loaders;
  return best;
}

}  // namespace

std::string storage_config(const Options& o, int epochs) {
  const std::uint64_t size = o.quick ? std::uint64_t{48} << 20 : o.storage_bytes;
  fs::path dir = o.storage_dir;
  if (dir.empty()) dir = fs::temp_directory_path() / "flowfeed_storage_bench";
  const DataSet d = write_data_set(dir, size, std::size_t{512} << 10);
  Options run_options = o;
  if (o.quick) run_options.storage_batch = 8;
  return npy_yaml(d, run_options, o.storage_loaders, "pread", false, epochs);
}

void storage(Bench& bench) {
  const Options& o = bench.options();
  const Registry& registry = bench.registry();
  const std::uint64_t size = o.quick ? std::uint64_t{48} << 20 : o.storage_bytes;
  const std::size_t row_bytes = std::size_t{512} << 10;  // 64 rows: one 32 MiB batch
  // A quick run (tests, perhaps several at once) writes a directory of its own.
  fs::path dir = o.storage_dir;
  if (dir.empty()) {
    dir = fs::temp_directory_path() / (o.quick
                                           ? "flowfeed_storage_bench_" + std::to_string(::getpid())
                                           : std::string("flowfeed_storage_bench"));
  }
  Options run_options = o;
  if (o.quick) run_options.storage_batch = 8;
  const DataSet d = write_data_set(dir, size, row_bytes);
  const int warm_epochs = o.quick ? 1 : o.storage_warm_epochs;
  nlohmann::json details = {{"features", d.features},
                            {"bytes", d.payload},
                            {"rows", d.rows},
                            {"row_bytes", d.row_bytes},
                            {"batch_size", run_options.storage_batch},
                            {"loaders", o.storage_loaders}};

  // The in-memory pageable path of the same bytes: the memory loader, its batches pageable (no
  // pin), uploaded without a staging node (cuda_upload's bounce buffers; host_upload on the host).
  const std::string memory_yaml = "pipeline: { epochs: " + std::to_string(warm_epochs) +
                                  ", batch_size: " + std::to_string(run_options.storage_batch) +
                                  ", prefetch_depth: " + std::to_string(o.storage_loaders * 2) +
                                  ", device: auto }\n"
                                  "nodes:\n"
                                  "  - { name: load, type: memory, params: { samples: " +
                                  std::to_string(d.rows) + ", sample_shape: [" +
                                  std::to_string(row_bytes / 4) +
                                  "], pin: false } }\n"
                                  "  - { name: upload, type: cuda_upload }\n"
                                  "  - { name: train, type: device_discard }\n";
  double memory_gbps = 0;
  {
    const PipelineConfig config = load_config_string(memory_yaml, registry, {}, "storage_memory");
    const RunReport m = Pipeline(config, registry).run();
    print_run("memory loader, pageable, same bytes (warm baseline)", m);
    memory_gbps = m.upload_gbps;
    details["memory"] = nlohmann::json::parse(m.to_json());
  }

  for (const char* io : {"pread", "io_uring"}) {
    // Cold: the raw ceiling first, then the pipeline, both from an evicted cache.
    evict(d.features);
    const double raw = parallel_read_gbps(d.features, kAlign, d.payload, true);
    std::printf("storage: raw parallel O_DIRECT reads, 8 MiB blocks: %.2f GB/s\n", raw);
    evict(d.features);
    const PipelineConfig cold_config = load_config_string(
        npy_yaml(d, run_options, o.storage_loaders, io, true, 1), registry, {}, "storage_cold");
    const RunReport cold = Pipeline(cold_config, registry).run();
    print_run((std::string("npy cold, direct, ") + io).c_str(), cold);
    bench.result(std::string("storage_cold_") + io, cold.upload_gbps, "GB/s", raw,
                 Target{0.95, true, false});

    // Warm: the whole file in the page cache first, then the pipeline through the cache.
    const double warm_read = parallel_read_gbps(d.features, 0, d.payload, false);
    std::printf("storage: warm-up read through the page cache: %.2f GB/s\n", warm_read);
    const RunReport warm = warm_sweep(bench, d, run_options, io, warm_epochs, memory_gbps,
                                      std::string("storage_warm_") + io, details);
    std::printf(
        "  host pools %.1f MiB for a %.2f GiB data set; staging copied %.0f bytes\n",
        pool_mib(warm), static_cast<double>(d.payload) / (1 << 30),
        warm.extra.count("stage.copied_bytes") ? warm.extra.at("stage.copied_bytes") : -1.0);
    details[std::string("raw_direct_gbps_") + io] = raw;
    details[std::string("cold_") + io] = nlohmann::json::parse(cold.to_json());
  }
  // Warm once more with io_async: io_uring hands the cached reads to the kernel's workers, pread
  // cuts each batch into read_bytes pieces read as tasks on idle workers; either way one batch's
  // copies out of the page cache run in parallel.
  for (const char* io : {"io_uring", "pread"}) {
    warm_sweep(bench, d, run_options, std::string(io) + ", io_async: true", warm_epochs,
               memory_gbps, std::string("storage_warm_") + io + "_async", details);
  }
  // Warm from the file mapped once: a copy out of the page cache with no system call per read,
  // the same copy the memory loader's path makes once the mapping's page tables are filled.
  warm_sweep(bench, d, run_options, "mmap", warm_epochs, memory_gbps, "storage_warm_mmap", details);
  warm_sweep(bench, d, run_options, "mmap, io_async: true", warm_epochs, memory_gbps,
             "storage_warm_mmap_async", details);
  // Warm with the rows left in the files' mapping, page-locked once while the pipeline is built
  // (pin: true): the upload's DMA reads the page cache itself, so no host copy is made at all.
  const RunReport pinned = warm_sweep(bench, d, run_options, "mmap, pin: true", warm_epochs,
                                      memory_gbps, "storage_warm_mmap_pinned", details);
  std::printf("  page-locking the mapping took %.3f s (while the pipeline was built)\n",
              pinned.extra.count("load.pin_seconds") ? pinned.extra.at("load.pin_seconds") : 0.0);
  bench.details("storage") = details;
  if (o.quick || !o.storage_keep) {
    std::error_code ec;
    fs::remove(d.features, ec);
    fs::remove(d.labels, ec);
    fs::remove(dir, ec);  // only when empty
  }
}

}  // namespace flowfeed::bench
