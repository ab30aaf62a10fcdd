// libFuzzer target for the checkpoint reader and validator: whatever the bytes of a manifest (and
// of the file list, after a NUL byte), read_checkpoint either returns a checkpoint, which
// resume_point then accepts or rejects against a fixed run, or throws ConfigError; opening the
// directory for writing (CheckpointDir, which reads both files to decide what is its own) does the
// same. Any other exception, a crash, a leak or undefined behaviour is a bug. The directory also
// holds a node file `train.1.bin` holding "weights", so that manifests naming it get as far as the
// node checks.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "flowfeed/checkpoint.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/sampler.hpp"

namespace {

namespace fs = std::filesystem;

void write(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const fs::path dir = [] {
    const fs::path d =
        fs::temp_directory_path() / ("flowfeed_checkpoint_fuzz_" + std::to_string(getpid()));
    fs::create_directories(d);
    return d;
  }();
  // A run of 1000 samples in global batches of 10: one rank, or rank 1 of 2.
  static const flowfeed::Sampler one(flowfeed::SamplerOptions{true, 9, false, 0, 1}, 1000, 10);
  static const flowfeed::Sampler two(flowfeed::SamplerOptions{true, 9, false, 1, 2}, 1000, 5);
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  write(dir / flowfeed::kCheckpointManifest, input.substr(0, nul));
  if (nul != std::string::npos) {
    write(dir / flowfeed::kCheckpointFiles, input.substr(nul + 1));
  } else {
    fs::remove(dir / flowfeed::kCheckpointFiles);
  }
  write(dir / "train.1.bin", "weights");
  try {
    const flowfeed::Checkpoint c = flowfeed::read_checkpoint(dir.string());
    for (const flowfeed::Sampler* s : {&one, &two}) {
      try {
        const flowfeed::ResumePoint p = flowfeed::resume_point(c, *s, 2, "fuzz");
        // What the run then relies on: a start and skips inside the run, ascending.
        const std::uint64_t end = 2 * s->batches_per_epoch();
        std::uint64_t last = p.first;
        if (p.first >= end) __builtin_trap();
        for (std::uint64_t k : p.skip) {
          if (k <= last || k >= end) __builtin_trap();
          last = k;
        }
      } catch (const flowfeed::ConfigError&) {
      }
    }
  } catch (const flowfeed::ConfigError&) {
    // The expected answer to a bad checkpoint.
  }
  try {
    flowfeed::CheckpointDir held(dir.string());
  } catch (const flowfeed::ConfigError&) {
  }
  return 0;
}
