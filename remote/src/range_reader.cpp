#include "range_reader.hpp"

#include <exception>
#include <utility>

namespace flowfeed::remote {

struct RangeReader::Job {
  const RangeRead* reads = nullptr;
  std::size_t count = 0;
  std::size_t next = 0;  ///< the next read to start
  std::size_t done = 0;  ///< reads ended
  std::size_t error_at = 0;
  std::exception_ptr error;  ///< of the first read (in order) that failed
};

RangeReader::RangeReader(std::function<void(const RangeRead&)> read, std::size_t threads)
    : read_(std::move(read)), max_threads_(threads > 0 ? threads - 1 : 0) {}

RangeReader::~RangeReader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RangeReader::work_on(Job& job, std::unique_lock<std::mutex>& lock) {
  while (job.next < job.count) {
    const std::size_t i = job.next++;
    if (job.next == job.count) std::erase(jobs_, &job);  // nothing left to start
    lock.unlock();
    std::exception_ptr error;
    try {
      read_(job.reads[i]);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && (!job.error || i < job.error_at)) {
      job.error = error;
      job.error_at = i;
    }
    if (++job.done == job.count) done_.notify_all();
  }
}

void RangeReader::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    work_on(*jobs_.front(), lock);
  }
}

void RangeReader::run(const RangeRead* reads, std::size_t count) {
  if (count == 0) return;
  if (count == 1 || max_threads_ == 0) {
    for (std::size_t i = 0; i < count; ++i) read_(reads[i]);
    return;
  }
  Job job;
  job.reads = reads;
  job.count = count;
  std::unique_lock<std::mutex> lock(mutex_);
  while (threads_.size() < max_threads_) threads_.emplace_back([this] { work(); });
  jobs_.push_back(&job);
  work_.notify_all();
  work_on(job, lock);
  done_.wait(lock, [&] { return job.done == job.count; });
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace flowfeed::remote
