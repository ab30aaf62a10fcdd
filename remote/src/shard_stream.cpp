#include "flowfeed/remote/shard_stream.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "flowfeed/error.hpp"
#include "remote_files_impl.hpp"

namespace flowfeed {

using remote::CacheOutcome;
using remote::HttpClient;
using remote::PinnedShard;

struct ShardStream::File {
  State state = State::idle;
  std::uint64_t size = 0;
  std::optional<PinnedShard> pin;  ///< while ready
  std::string path;                ///< the cached copy, once fetched
  int uses = 0;                    ///< acquire() calls not yet released
  int waiters = 0;                 ///< acquire() calls waiting for it
  bool wanted = false;             ///< in the plan and not done()
  std::size_t place = 0;           ///< its place in the plan
  std::exception_ptr error;        ///< why its fetch failed (state failed)
};

ShardStream::ShardStream(RemoteFiles& files, std::vector<std::string> urls,
                         std::vector<std::uint64_t> sizes)
    : files_(files),
      urls_(std::move(urls)),
      state_(urls_.size()),
      budget_(files.options().cache_bytes) {
  for (std::size_t i = 0; i < state_.size(); ++i) state_[i].size = sizes.at(i);
  const int asked = files_.options().transfers;
  const std::size_t transfers =
      std::min<std::size_t>(std::max<std::size_t>(urls_.size(), 1),
                            asked > 0 ? static_cast<std::size_t>(asked) : std::size_t{8});
  threads_.reserve(transfers);
  for (std::size_t t = 0; t < transfers; ++t) threads_.emplace_back([this] { work(); });
}

ShardStream::~ShardStream() {
  stop_ = true;
  changed_.notify_all();
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ShardStream::plan(const std::vector<std::size_t>& order) {
  std::lock_guard<std::mutex> lock(mutex_);
  plan_ = order;
  cursor_ = 0;
  for (std::size_t k = 0; k < plan_.size(); ++k) {
    File& f = state_.at(plan_[k]);
    f.wanted = true;
    f.place = k;
    // A failed fetch is tried again when the file is wanted again.
    if (f.state == State::failed) f.state = State::idle;
  }
  work_.notify_all();
  changed_.notify_all();
}

std::optional<std::size_t> ShardStream::next_file() {
  while (!demand_.empty()) {
    const std::size_t i = demand_.front();
    if (state_[i].state != State::idle) {
      demand_.erase(demand_.begin());
      continue;
    }
    // The bodies wait for it: room is made by letting go of files fetched ahead. When files
    // fetched ahead are still arriving, it waits for them to complete (they can be let go then)
    // and nothing else starts meanwhile.
    if (!make_room(state_[i].size) && fetching_ahead()) return std::nullopt;
    demand_.erase(demand_.begin());
    return i;
  }
  while (cursor_ < plan_.size()) {
    File& f = state_[plan_[cursor_]];
    if (f.state != State::idle || !f.wanted) {
      ++cursor_;
      continue;
    }
    // Ahead only as far as the budget allows; the rest waits for files to be done.
    if (held_ + f.size > budget_) return std::nullopt;
    return plan_[cursor_++];
  }
  return std::nullopt;
}

bool ShardStream::make_room(std::uint64_t bytes) {
  // Files fetched ahead that no body holds, the furthest in the plan first.
  std::vector<std::size_t> ahead;
  for (std::size_t i = 0; i < state_.size(); ++i) {
    const File& f = state_[i];
    if (f.state == State::ready && f.uses == 0 && f.waiters == 0) ahead.push_back(i);
  }
  std::sort(ahead.begin(), ahead.end(),
            [&](std::size_t a, std::size_t b) { return state_[a].place > state_[b].place; });
  for (std::size_t i : ahead) {
    if (held_ + bytes <= budget_) break;
    unhold(state_[i]);
    cursor_ = std::min(cursor_, state_[i].place);  // fetched again when its turn comes
  }
  return held_ + bytes <= budget_;
}

bool ShardStream::fetching_ahead() const {
  return std::any_of(state_.begin(), state_.end(),
                     [](const File& f) { return f.state == State::fetching && f.waiters == 0; });
}

void ShardStream::unhold(File& f) {
  f.pin.reset();  // the cache may evict it now (it stays there until it needs the room)
  f.state = State::idle;
  held_ -= f.size;
}

void ShardStream::work() {
  std::optional<HttpClient> client;
  remote::RetryCounters& retries = files_.pins_->retries;
  for (;;) {
    std::size_t i = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      std::optional<std::size_t> next;
      // While the run is cancelled nothing starts (a later run of the pipeline goes on).
      work_.wait_for(lock, std::chrono::milliseconds(100), [&] {
        return stop_ || (!run_cancelled() && (next = next_file()).has_value());
      });
      if (stop_) return;
      if (!next) continue;
      i = *next;
      state_[i].state = State::fetching;
      held_ += state_[i].size;
      peak_held_ = std::max(peak_held_, held_);
    }
    if (!client) {
      client.emplace(files_.options(), retries);
      client->set_cancel(run_cancel_, &stop_);
    }
    std::optional<PinnedShard> pin;
    std::exception_ptr error;
    bool cancelled = false;
    std::uint64_t received = 0;
    CacheOutcome outcome;
    try {
      const remote::Request request = remote::request_for(*files_.pins_, urls_[i]);
      pin.emplace(remote::fetch_one(*files_.cache_, *client, *files_.pins_, urls_[i], request,
                                    state_[i].size, received, outcome));
      files_.count(received, outcome);
    } catch (const remote::Cancelled&) {
      cancelled = true;  // the partial transfer stays in the cache, resumed next time
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      File& f = state_[i];
      if (pin) {
        f.path = pin->path();
        f.pin.emplace(std::move(*pin));
        f.state = State::ready;
        std::lock_guard<std::mutex> names(files_.pins_->mutex);
        files_.pins_->url_of[f.path] = urls_[i];
      } else {
        held_ -= f.size;
        f.state = cancelled ? State::idle : State::failed;
        f.error = error;
        if (cancelled) cursor_ = std::min(cursor_, f.place);
      }
      if (f.state == State::ready && !f.wanted && f.uses == 0 && f.waiters == 0) unhold(f);
    }
    changed_.notify_all();  // the waits for this file
    work_.notify_all();     // room freed, or a file that could be let go for a demand
  }
}

std::string ShardStream::acquire(std::size_t i) {
  return acquire(i, false);
}

std::string ShardStream::acquire(std::size_t i, bool at_build) {
  std::unique_lock<std::mutex> lock(mutex_);
  File& f = state_.at(i);
  if (f.state == State::ready) {
    ++f.uses;
    return f.path;
  }
  const auto start = std::chrono::steady_clock::now();
  // While it waits, a fetched file stays held for it.
  ++f.waiters;
  struct Waiting {
    int& waiters;
    ~Waiting() { --waiters; }
  } waiting{f.waiters};
  for (;;) {
    if (f.state == State::ready) break;
    if (f.state == State::failed) {
      const std::exception_ptr error = f.error;
      f.state = State::idle;  // a later acquire tries again
      std::rethrow_exception(error);
    }
    if (run_cancelled() || stop_) {
      throw remote::Cancelled(
          fmt::format("{}: the wait for the shard was cancelled (the run is stopping)", urls_[i]));
    }
    if (at_build && remote::builds_interrupted()) {
      // The transfer goes on until the stream stops (the failed build destroys it).
      throw remote::Cancelled(fmt::format(
          "{}: the wait for the shard was cancelled (the build is stopping)", urls_[i]));
    }
    if (f.state == State::idle && std::find(demand_.begin(), demand_.end(), i) == demand_.end()) {
      demand_.push_back(i);
      work_.notify_all();
    }
    changed_.wait_for(lock, std::chrono::milliseconds(50));
  }
  ++f.uses;
  if (at_build) return f.path;
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> stats(files_.pins_->mutex);
  files_.stats_.wait_seconds += waited;
  ++files_.stats_.waits;
  return f.path;
}

void ShardStream::release(std::size_t i) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    File& f = state_.at(i);
    if (--f.uses == 0) {
      // Let go, or now one that could be let go for a demand: a transfer may start.
      if (!f.wanted && f.waiters == 0 && f.state == State::ready) unhold(f);
      wake = f.state == State::idle || !demand_.empty();
    }
  }
  if (wake) work_.notify_all();
}

void ShardStream::done(std::size_t i) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    File& f = state_.at(i);
    f.wanted = false;
    if (f.uses == 0 && f.waiters == 0 && f.state == State::ready) {
      unhold(f);
      wake = true;
    }
  }
  if (wake) work_.notify_all();
}

void ShardStream::wait_for_first(std::size_t count) {
  std::vector<std::size_t> first;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    first.assign(plan_.begin(),
                 plan_.begin() + static_cast<std::ptrdiff_t>(std::min(count, plan_.size())));
  }
  for (std::size_t i : first) {
    acquire(i, true);
    release(i);
  }
}

std::uint64_t ShardStream::held_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_;
}

std::uint64_t ShardStream::peak_held_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_held_;
}

}  // namespace flowfeed
