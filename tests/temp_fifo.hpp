#pragma once
// A named pipe for tests of reads that block: opening it waits for a writer.

#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <utility>

namespace flowfeed::test {

/// A FIFO at `path` (replacing any file there), removed on destruction.
class TempFifo {
 public:
  explicit TempFifo(std::string path) : path_(std::move(path)) {
    std::remove(path_.c_str());
    made_ = mkfifo(path_.c_str(), 0600) == 0;
  }
  ~TempFifo() { std::remove(path_.c_str()); }
  TempFifo(const TempFifo&) = delete;
  TempFifo& operator=(const TempFifo&) = delete;

  /// False when mkfifo failed.
  bool made() const { return made_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool made_ = false;
};

}  // namespace flowfeed::test
