// libFuzzer target for the tar shard index: whatever the bytes of a shard, read_tar_listing and
// the WebDataset index built on it either list members that lie inside the file or throw
// DataError, in time linear in the file; any other exception, a crash, a hang, a leak or
// undefined behaviour is a bug. Input: the bytes of one tar file.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "flowfeed/error.hpp"
#include "flowfeed/nodes/detail/tar_index.hpp"
#include "flowfeed/nodes/detail/webdataset_index.hpp"

namespace {

/// The input as a regular file without touching the disk (a memfd, named through /proc).
class MemoryFile {
 public:
  MemoryFile(const std::uint8_t* data, std::size_t size) : fd_(::memfd_create("shard", 0)) {
    if (fd_ < 0) std::abort();
    std::size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += static_cast<std::size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const MemoryFile file(data, size);
  try {
    const flowfeed::TarListing listing = flowfeed::read_tar_listing(file.path());
    std::uint64_t previous = 0;
    for (const flowfeed::TarMember& m : listing.members) {
      // Headers strictly advance, and every member but a cut-short last one is inside the file.
      if (m.header < previous || m.offset != m.header + 512 || m.offset > listing.file_size) {
        std::abort();
      }
      if (!m.cut_short && m.size > listing.file_size - m.offset) std::abort();
      previous = m.header + 512;
    }
  } catch (const flowfeed::DataError&) {
    return 0;  // the expected answer to a damaged shard
  }
  try {
    const flowfeed::WebDatasetIndex index({file.path()}, {"json"});
    for (const flowfeed::ShardSample& s : index.samples()) (void)index.where(s);
  } catch (const flowfeed::DataError&) {
  }
  return 0;
}
