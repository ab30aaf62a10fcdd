// Measures the image_folder index build of a class tree: image_folder_index_bench ROOT [RUNS]
// prints, per run, the files, classes, seconds, the index's bytes (and per file) and the peak
// resident memory growth. docs/IMAGES.md gives the figures and how the tree was made.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "flowfeed/nodes/detail/image_folder_index.hpp"

namespace {
long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s ROOT [RUNS]\n", argv[0]);
    return 2;
  }
  const int runs = argc > 2 ? std::atoi(argv[2]) : 3;
  try {
    for (int run = 0; run < runs; ++run) {
      const long before = peak_rss_kib();
      const auto start = std::chrono::steady_clock::now();
      const flowfeed::ImageFolderIndex index = flowfeed::ImageFolderIndex::walk(argv[1]);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double files = static_cast<double>(index.files().size());
      std::printf(
          "run %d: %zu files, %zu classes, %.3f s, index %zu bytes (%.1f per file), peak RSS "
          "+%ld KiB\n",
          run, index.files().size(), index.classes().size(), seconds, index.memory_bytes(),
          static_cast<double>(index.memory_bytes()) / files, peak_rss_kib() - before);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
