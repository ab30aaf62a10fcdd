// The images scenario: JPEGs from WebDataset shards to float32 on the device (configs/images.yaml:
// decode + random resized crop 224 + flip on the graph's workers, upload of uint8, normalize on the
// GPU) at 1, 4 and all cores, against libjpeg-turbo's full-size decode rate of the same files on
// one thread of this process, times the thread count: the CPU ceiling of any JPEG loader.
#include <fcntl.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "flowfeed/nodes/detail/webdataset_index.hpp"
#include "flowfeed/nodes/webdataset.hpp"

namespace flowfeed::bench {

namespace {

/// The first `count` JPEG members of the shards, read into memory.
std::vector<std::vector<unsigned char>> read_jpegs(const WebDatasetIndex& index,
                                                   std::size_t count) {
  std::vector<std::vector<unsigned char>> out;
  std::vector<int> fds(index.shards().size(), -1);
  for (const ShardSample& s : index.samples()) {
    if (out.size() == count) break;
    if (s.problem != SampleProblem::none || s.format != ImageFormat::jpeg) continue;
    int& fd = fds[s.shard];
    if (fd < 0) fd = ::open(index.shards()[s.shard].c_str(), O_RDONLY | O_CLOEXEC);
    std::vector<unsigned char> bytes(s.image_bytes);
    if (fd < 0 || ::pread(fd, bytes.data(), bytes.size(), static_cast<off_t>(s.image_offset)) !=
                      static_cast<ssize_t>(bytes.size())) {
      for (int f : fds) {
        if (f >= 0) ::close(f);
      }
      throw std::runtime_error(index.where(s) + "cannot be read");
    }
    out.push_back(std::move(bytes));
  }
  for (int f : fds) {
    if (f >= 0) ::close(f);
  }
  return out;
}

/// CPU seconds of this thread (process_cpu_seconds: of every thread).
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

struct DecodeRate {
  double images_per_second = 0;
  double images_per_cpu_second = 0;
  double megapixels_per_second = 0;
  std::size_t images = 0;
  double mean_bytes = 0;
};

/// Decodes every image once at full size to RGB (TurboJPEG's default, accurate IDCT) on this
/// thread, after one untimed decode that sizes the output buffer.
DecodeRate single_thread_decode(const std::vector<std::vector<unsigned char>>& jpegs) {
  tjhandle handle = tjInitDecompress();
  if (!handle) throw std::runtime_error("tjInitDecompress failed");
  std::vector<unsigned char> pixels;
  auto decode = [&](const std::vector<unsigned char>& j) {
    int width = 0, height = 0, subsampling = 0, colorspace = 0;
    int rc =
        tjDecompressHeader3(handle, j.data(), j.size(), &width, &height, &subsampling, &colorspace);
    if (rc == 0) {
      pixels.resize(static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3);
      rc = tjDecompress2(handle, j.data(), j.size(), pixels.data(), width, 0, height, TJPF_RGB, 0);
    }
    if (rc != 0) {
      const std::string why = tjGetErrorStr2(handle);
      tjDestroy(handle);
      throw std::runtime_error("TurboJPEG decode: " + why);
    }
    return static_cast<double>(width) * height;
  };
  decode(jpegs.front());
  DecodeRate r;
  double pixels_total = 0, bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = thread_cpu_seconds();
  for (const auto& j : jpegs) {
    pixels_total += decode(j);
    bytes += static_cast<double>(j.size());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu = thread_cpu_seconds() - cpu_start;
  tjDestroy(handle);
  r.images_per_cpu_second = static_cast<double>(jpegs.size()) / cpu;
  r.images = jpegs.size();
  r.images_per_second = static_cast<double>(jpegs.size()) / seconds;
  r.megapixels_per_second = pixels_total / seconds / 1e6;
  r.mean_bytes = bytes / static_cast<double>(jpegs.size());
  return r;
}

}  // namespace

void images(Bench& bench) {
  const Options& o = bench.options();
  if (!bench.has_image_shards("images")) return;
  const WebDatasetIndex index(expand_shards({o.image_shards}));
  const auto jpegs = read_jpegs(index, o.quick ? 16 : static_cast<std::size_t>(o.decode_images));
  if (jpegs.empty()) throw std::runtime_error("images: the shards hold no JPEG: " + o.image_shards);
  const DecodeRate decode = single_thread_decode(jpegs);
  std::printf(
      "images: %zu samples in %zu shards; TurboJPEG full decode, 1 thread: %.0f images/s "
      "(%.1f MP/s, mean %.0f bytes, %zu images)\n",
      index.samples().size(), index.shards().size(), decode.images_per_second,
      decode.megapixels_per_second, decode.mean_bytes, decode.images);

  std::vector<int> threads = o.image_threads;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (threads.empty()) threads = o.quick ? std::vector<int>{1, 2} : std::vector<int>{1, 4, cores};
  nlohmann::json& details = bench.details("images");
  details["shards"] = index.shards().size();
  details["samples"] = index.samples().size();
  details["config"] = o.images_config;
  details["decode"] = {{"images", decode.images},
                       {"images_per_second", decode.images_per_second},
                       {"megapixels_per_second", decode.megapixels_per_second},
                       {"images_per_cpu_second", decode.images_per_cpu_second},
                       {"mean_jpeg_bytes", decode.mean_bytes},
                       {"library", "TurboJPEG (libjpeg-turbo), accurate IDCT, RGB"}};
  nlohmann::json& runs = details["runs"];
  for (int t : threads) {
    std::vector<std::string> overrides = {
        "nodes.load.params.shards=" + o.image_shards, "pipeline.threads=" + std::to_string(t),
        "pipeline.epochs=" + std::to_string(o.quick ? 1 : o.image_epochs)};
    if (o.quick) {
      overrides.push_back("pipeline.batch_size=4");
      overrides.push_back("pipeline.prefetch_depth=3");
    }
    overrides.insert(overrides.end(), o.overrides.begin(), o.overrides.end());
    Pipeline pipeline(load_config_file(o.images_config, bench.registry(), overrides),
                      bench.registry());
    const double cpu_start = process_cpu_seconds();
    const RunReport r = pipeline.run();
    const double cpu = process_cpu_seconds() - cpu_start;
    const std::string what = "images, " + std::to_string(t) + (t == 1 ? " thread" : " threads");
    print_run(what.c_str(), r);
    // On a shared machine wall-clock rates follow the other load; CPU time per image does not
    // (as much): images per CPU second of the whole process, against the decode's per CPU second.
    const double per_cpu = static_cast<double>(r.samples) / cpu;
    std::printf("  %s: %.0f images per CPU second (%.1f CPU s), %.3f of the decode's %.0f\n",
                what.c_str(), per_cpu, cpu, per_cpu / decode.images_per_cpu_second,
                decode.images_per_cpu_second);
    const double ceiling = decode.images_per_second * t;
    std::optional<Target> target;
    if (t == cores) target = Target{0.8, true, false};
    bench.result("images.threads_" + std::to_string(t), r.samples_per_second, "images/s", ceiling,
                 target);
    runs.push_back({{"threads", t},
                    {"images_per_second", r.samples_per_second},
                    {"decode_ceiling", ceiling},
                    {"seconds", r.seconds},
                    {"cpu_seconds", cpu},
                    {"images_per_cpu_second", per_cpu},
                    {"samples", r.samples},
                    {"skipped_samples", r.skipped_samples},
                    {"bytes_uploaded", r.bytes_uploaded},
                    {"allocations_after_build", r.allocations_after_build},
                    {"device", r.device}});
  }
}

}  // namespace flowfeed::bench
