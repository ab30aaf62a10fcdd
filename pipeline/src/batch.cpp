#include "flowfeed/batch.hpp"

#include <stdexcept>

#include "flowfeed/memory_budget.hpp"
#include "flowfeed/node.hpp"

namespace flowfeed {

std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32: return 4;
    case DType::float16: return 2;
    case DType::uint8: return 1;
    case DType::int32: return 4;
    case DType::int64: return 8;
    case DType::uint16: return 2;
    case DType::uint32: return 4;
    case DType::bfloat16: return 2;
  }
  return 0;
}

const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32: return "float32";
    case DType::float16: return "float16";
    case DType::uint8: return "uint8";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::uint16: return "uint16";
    case DType::uint32: return "uint32";
    case DType::bfloat16: return "bfloat16";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) noexcept {
  for (DType d : {DType::float32, DType::float16, DType::uint8, DType::int32, DType::int64,
                  DType::uint16, DType::uint32, DType::bfloat16}) {
    if (name == dtype_name(d)) return d;
  }
  return std::nullopt;
}

std::size_t TensorSpec::sample_elements() const noexcept {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

std::optional<std::size_t> TensorSpec::checked_sample_bytes() const noexcept {
  std::uint64_t n = dtype_size(dtype);
  for (auto d : shape) {
    if (d < 0) return std::nullopt;
    auto next = checked_mul(n, static_cast<std::uint64_t>(d));
    if (!next) return std::nullopt;
    n = *next;
  }
  return n;
}

std::optional<std::size_t> BatchLayout::checked_capacity() const noexcept {
  std::uint64_t off = 0;
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    auto sample = tensors_[i].checked_sample_bytes();
    auto rows = sample ? checked_mul(*sample, batch_size_) : std::nullopt;
    auto end = rows ? checked_add(off, *rows) : std::nullopt;
    // Room for the alignment padding after it.
    auto padded = end ? checked_add(*end, kAlignment) : std::nullopt;
    if (!padded) return std::nullopt;
    off = i + 1 < tensors_.size() ? (*end + kAlignment - 1) / kAlignment * kAlignment : *end;
  }
  return off;
}

namespace {
std::size_t align_up(std::size_t n, std::size_t a) {
  return (n + a - 1) / a * a;
}
}  // namespace

BatchLayout::BatchLayout(std::vector<TensorSpec> tensors, std::size_t batch_size)
    : tensors_(std::move(tensors)), batch_size_(batch_size) {}

std::size_t BatchLayout::offset(std::size_t index, std::size_t rows) const noexcept {
  std::size_t off = 0;
  for (std::size_t i = 0; i < index && i < tensors_.size(); ++i) {
    off = align_up(off + rows * tensors_[i].sample_bytes(), kAlignment);
  }
  return off;
}

std::size_t BatchLayout::bytes(std::size_t rows) const noexcept {
  if (tensors_.empty()) return 0;
  return offset(tensors_.size() - 1, rows) + rows * tensors_.back().sample_bytes();
}

int BatchLayout::find(std::string_view name) const noexcept {
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

Lease& Batch::lease(Tier tier) noexcept {
  switch (tier) {
    case Tier::host: return host;
    case Tier::staging: return staging;
    case Tier::device: break;
  }
  return device;
}

const Lease& Batch::lease(Tier tier) const noexcept {
  return const_cast<Batch*>(this)->lease(tier);
}

std::byte* Batch::data(Tier tier) const noexcept {
  return lease(tier).data();
}

std::byte* Batch::tensor(Tier tier, std::size_t index) const noexcept {
  std::byte* base = data(tier);
  return base ? base + layout->offset(index, rows()) : nullptr;
}

Tier Batch::newest_tier() const noexcept {
  if (device) return Tier::device;
  if (staging) return Tier::staging;
  return Tier::host;
}

void Batch::reset() noexcept {
  host.reset();
  staging.reset();
  device.reset();
  samples.clear();
  external.clear();
  sync.clear();
  error = nullptr;
  skipped = false;
  end_of_data = false;
  past_end = false;
}

const BatchLayout& BuildContext::change_layout(std::vector<TensorSpec> /*tensors*/) {
  throw std::logic_error("change_layout: this build context cannot change the batch layout");
}

}  // namespace flowfeed
