#pragma once
/// \file
/// Loaders that hold their whole data set in host memory, so that a train node can take all of it
/// at build time (resident mode: upload once, then train from device views).

#include <cstddef>

namespace flowfeed {

/// Implemented by loaders (besides LoaderNode) whose data set sits in host memory.
class InMemoryDataset {
 public:
  virtual ~InMemoryDataset() = default;
  /// True when the loader runs in resident mode: its batches carry sample indices only (no
  /// buffers), and the train node reads every sample through copy_all() at build time. A resident
  /// pipeline is load -> train, with no staging or upload nodes between.
  virtual bool resident() const noexcept = 0;
  /// Writes tensor `tensor` (an index into sample_tensors()) of every sample, in data set order,
  /// into dst, which holds size() x that tensor's sample_bytes(). Thread-safe (reads only).
  virtual void copy_all(std::size_t tensor, void* dst) const = 0;
};

}  // namespace flowfeed
