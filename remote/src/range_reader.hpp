#pragma once
// RemoteFiles::read_ranges(): the reads of one call spread over a few threads, each request on a
// connection of its own (docs/REMOTE.md, "Random access by Range requests").
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "flowfeed/remote/remote_files.hpp"

namespace flowfeed::remote {

/// Runs the reads of each call of run() on the calling thread and on up to `threads` - 1 threads
/// of its own (started at the first call with more than one read, kept until it is destroyed).
/// Calls from several threads share the threads. Thread-safe.
class RangeReader {
 public:
  /// `read` does one read (RemoteFiles::read_range); `threads` ≥ 1.
  RangeReader(std::function<void(const RangeRead&)> read, std::size_t threads);
  ~RangeReader();
  RangeReader(const RangeReader&) = delete;
  RangeReader& operator=(const RangeReader&) = delete;

  /// Does every read and returns when all are done. When some failed, throws the error of the
  /// first of them in the order given (after every read ended).
  void run(const RangeRead* reads, std::size_t count);

 private:
  struct Job;
  /// Takes reads of `job` while it has some left; under `lock`, released while a read runs.
  void work_on(Job& job, std::unique_lock<std::mutex>& lock);
  void work();

  std::function<void(const RangeRead&)> read_;
  std::size_t max_threads_;
  std::mutex mutex_;
  std::condition_variable work_, done_;
  std::deque<Job*> jobs_;  ///< calls with reads left to start
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

}  // namespace flowfeed::remote
