#include "flowfeed/nodes/detail/webdataset_loader.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include "flowfeed/config.hpp"
#include "flowfeed/data_file.hpp"
#include "flowfeed/nodes/detail/file_set.hpp"
#include "flowfeed/nodes/detail/streamed_shards.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/stats.hpp"

namespace flowfeed {

std::vector<std::string> field_names(const std::vector<BytesField>& fields) {
  std::vector<std::string> names;
  for (const BytesField& f : fields) names.push_back(f.field);
  return names;
}

namespace {

/// `bytes_fields`: "json:4096, txt:256" → {json, 4096}, {txt, 256}.
void parse_bytes_fields(const NodeSpec& spec, WebDatasetOptions& o,
                        std::vector<std::string>& problems) {
  const std::string& text = spec.params.get_string("bytes_fields");
  auto problem = [&](const std::string& what) {
    problems.push_back(fmt::format("{}: nodes.{}.params.bytes_fields: {}",
                                   param_where(spec, "bytes_fields"), spec.name, what));
  };
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t end = text.find_first_of(", ", pos);
    const std::string item = text.substr(pos, end == std::string::npos ? end : end - pos);
    pos = end == std::string::npos ? text.size() : end + 1;
    if (item.empty()) continue;
    const std::size_t colon = item.find(':');
    std::size_t max = 0;
    const char* digits = item.data() + colon + 1;
    const auto [rest, ec] = colon == std::string::npos
                                ? std::from_chars(digits, digits, max)
                                : std::from_chars(digits, item.data() + item.size(), max);
    if (colon == std::string::npos || colon == 0 || ec != std::errc() ||
        rest != item.data() + item.size() || max < 1 || max > (1u << 30)) {
      problem(
          fmt::format("'{}' is not field:max_bytes (e.g. json:4096, max_bytes 1 to 2^30)", item));
      continue;
    }
    const std::string field = item.substr(0, colon);
    const bool taken = field == "cls" || field == "jpg" || field == "jpeg" || field == "png" ||
                       std::any_of(o.bytes_fields.begin(), o.bytes_fields.end(),
                                   [&](const BytesField& f) { return f.field == field; });
    if (taken) {
      problem(fmt::format("'{}' is the image, the label or listed twice", field));
      continue;
    }
    o.bytes_fields.push_back({field, max});
  }
  if (o.bytes_fields.size() > 8) problem("at most 8 fields");
}

/// The index of the options' shards; a shard fetched by URL is named by its URL in messages.
WebDatasetIndex index_of(const WebDatasetOptions& o, std::shared_ptr<RemoteFiles>& remote) {
  std::vector<std::string> paths = expand_shards(o.shards, o.remote, remote);
  try {
    WebDatasetIndex index(paths, field_names(o.bytes_fields));
    if (remote) {
      for (std::string& p : paths) p = name_urls(remote.get(), p);
      index.name_shards(std::move(paths));
    }
    return index;
  } catch (const DataError& e) {
    throw DataError(name_urls(remote.get(), e.what()));
  }
}

}  // namespace

WebDatasetLoader::WebDatasetLoader(WebDatasetOptions options)
    : options_(std::move(options)),
      index_(options_.index.empty() ? index_of(options_, remote_) : index_from_files()),
      workers_(std::make_unique<DecodeWorkers>()) {
  if (index_.samples().empty()) {
    throw DataError(fmt::format("shards: '{}' hold no sample", fmt::join(options_.shards, ", ")));
  }
  target_ = decode_target(options_);
  sample_bytes_ = image_bytes(options_);
  // With index files the tars are opened at setup, when the sampler's order is known.
  if (!options_.index.empty()) {
    fds_.assign(index_.shards().size(), -1);
    return;
  }
  for (const std::string& path : index_.shards()) {
    try {
      fds_.push_back(DataFile(path).release());
    } catch (const DataError& e) {
      for (int f : fds_) ::close(f);
      throw DataError(name_urls(remote_.get(), e.what()));
    }
  }
}

WebDatasetLoader::~WebDatasetLoader() {
  streaming_.reset();  // its transfers stop before the files close
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

WebDatasetOptions WebDatasetLoader::options_from(const NodeSpec& spec) {
  WebDatasetOptions o;
  o.shards = spec.params.get_string_list("shards");
  o.index = spec.params.get_string_list("index");
  o.remote = remote_options_from(spec.params);
  std::vector<std::string> problems;
  image_options_from(spec, o, problems);
  parse_bytes_fields(spec, o, problems);
  if (!problems.empty()) throw ConfigError(std::move(problems));
  return o;
}

std::vector<std::size_t> WebDatasetLoader::shard_starts() const {
  // The index lists samples in shard order: a shard starts where the shard number changes.
  std::vector<std::size_t> starts;
  const std::vector<ShardSample>& samples = index_.samples();
  for (std::size_t i = 0; i < samples.size(); ++i) {
    if (i == 0 || samples[i].shard != samples[i - 1].shard) starts.push_back(i);
  }
  return starts;
}

std::vector<TensorSpec> WebDatasetLoader::sample_tensors() const {
  std::vector<TensorSpec> tensors = image_tensors(options_);
  for (const BytesField& f : options_.bytes_fields) {
    tensors.push_back({f.field, DType::uint8, {static_cast<std::int64_t>(f.max_bytes)}});
    tensors.push_back({f.field + "_len", DType::int32, {}});
  }
  return tensors;
}

void WebDatasetLoader::setup(BuildContext& context) {
  policy_ = row_policy(options_.parallel, context.pipeline_options());
  node_name_ = context.spec().name;
  drops_.set_who(fmt::format("node '{}' (webdataset)", node_name_));
  if (!options_.index.empty()) open_shards(context);
  if (!policy_.skip) {
    // Without skip a sample that the headers already show to be unusable would fail its batch
    // later: say so now, before the run starts.
    for (const ShardSample& s : index_.samples()) {
      if (s.problem != SampleProblem::none) {
        throw DataError(index_.where(s) + ": " + index_.problem_text(s) +
                        " (set pipeline.on_error: skip to drop such samples)");
      }
    }
  }
  pool_ = &context.make_batch_pool("host", MemoryKind::pageable, context.layout().capacity(),
                                   Allocator::host());
}

void WebDatasetLoader::begin_run() {
  drops_.reset();
}

void WebDatasetLoader::read_exact(const ShardSample& s, std::uint64_t offset, std::size_t bytes,
                                  std::uint8_t* dst) const {
  const int fd = fds_[s.shard];
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(fd, dst + done, bytes - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      throw DataError(fmt::format("{}: read of {} bytes at offset {} failed ({})", index_.where(s),
                                  bytes, offset + done,
                                  got < 0 ? std::strerror(errno) : "end of file"));
    }
    done += static_cast<std::size_t>(got);
  }
}

std::int32_t WebDatasetLoader::parse_label(const ShardSample& s, const std::uint8_t* bytes) const {
  std::string_view text(reinterpret_cast<const char*>(bytes), s.label_bytes);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    throw DataError(fmt::format("{}: label '{}' in its .cls member is not an integer",
                                index_.where(s), text.substr(0, 32)));
  }
  const bool bad = options_.num_classes > 0 ? v < 0 || v >= options_.num_classes
                                            : v < std::numeric_limits<std::int32_t>::min() ||
                                                  v > std::numeric_limits<std::int32_t>::max();
  if (bad) {
    throw DataError(fmt::format("{}: label {} is out of range {}", index_.where(s), v,
                                options_.num_classes > 0
                                    ? fmt::format("[0, {})", options_.num_classes)
                                    : std::string("for int32")));
  }
  return static_cast<std::int32_t>(v);
}

void WebDatasetLoader::read_fields(std::uint32_t sample, const RowTargets& row) const {
  const ShardSample& s = index_.samples()[sample];
  for (std::size_t f = 0; f < options_.bytes_fields.size(); ++f) {
    const FieldLocation& at = index_.field(sample, f);
    const BytesField& field = options_.bytes_fields[f];
    if (at.size > field.max_bytes) {
      throw DataError(
          fmt::format("{}: its .{} member holds {} bytes, more than the {} of "
                      "bytes_fields",
                      index_.where(s), field.field, at.size, field.max_bytes));
    }
    read_exact(s, at.offset, at.size, row.field[f]);
    std::memset(row.field[f] + at.size, 0, field.max_bytes - at.size);
    *row.field_len[f] = static_cast<std::int32_t>(at.size);
  }
}

void WebDatasetLoader::load_sample(std::uint32_t sample, std::uint32_t epoch,
                                   const RowTargets& row) {
  const ShardSample& s = index_.samples()[sample];
  if (s.problem != SampleProblem::none) {
    throw DataError(index_.where(s) + ": " + index_.problem_text(s));
  }
  DecodeWorker& w = workers_->per_thread.local();
  // The label first: it is 64 bytes at most and needs no buffer of its own.
  std::uint8_t label[64];
  if (s.label_bytes > sizeof label) {
    throw DataError(index_.where(s) +
                    ": its .cls member holds more than 64 bytes (a label is "
                    "one integer)");
  }
  read_exact(s, s.label_offset, s.label_bytes, label);
  *row.y = parse_label(s, label);
  read_fields(sample, row);
  if (w.encoded.size() < s.image_bytes) w.encoded.resize(s.image_bytes);
  read_exact(s, s.image_offset, s.image_bytes, w.encoded.data());
  decode_image_sample(w.decoder, w.encoded.data(), s.image_bytes, s.format, options_, target_,
                      epoch, sample, index_.where(s), node_name_, row.x);
}

void WebDatasetLoader::process(Batch& batch) {
  // Tars streamed during the run: held (waited for) while the batch reads them.
  const StreamedShards::Hold hold = hold_streamed(streaming_.get(), remote_.get(), batch);
  batch.host = pool_->acquire();
  const std::size_t fields = options_.bytes_fields.size();
  auto targets = [&batch, fields, this](std::size_t row) {
    RowTargets t{};
    t.x = reinterpret_cast<std::uint8_t*>(batch.tensor(Tier::host, 0)) + row * sample_bytes_;
    t.y = reinterpret_cast<std::int32_t*>(batch.tensor(Tier::host, 1)) + row;
    for (std::size_t f = 0; f < fields; ++f) {
      t.field[f] = reinterpret_cast<std::uint8_t*>(batch.tensor(Tier::host, 2 + 2 * f)) +
                   row * options_.bytes_fields[f].max_bytes;
      t.field_len[f] = reinterpret_cast<std::int32_t*>(batch.tensor(Tier::host, 3 + 2 * f)) + row;
    }
    return t;
  };
  load_rows(batch, policy_, drops_,
            [&](std::size_t row) { load_sample(batch.samples[row], batch.epoch, targets(row)); });
}

void WebDatasetLoader::finish(RunReport& report) {
  drops_.finish(report);
  report_remote(remote_, node_name_, report);
}

}  // namespace flowfeed
