#include "webdataset_loader.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <oneapi/tbb/enumerable_thread_specific.h>
#include <oneapi/tbb/parallel_for.h>
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
#include "flowfeed/pool.hpp"
#include "flowfeed/stats.hpp"

namespace flowfeed {

/// What one thread decodes with: its decoder and the encoded bytes of its current sample. Each
/// grows to the largest sample it has met, then is reused.
struct DecodeWorker {
  ImageDecoder decoder;
  std::vector<std::uint8_t> encoded;
};
struct DecodeWorkers {
  tbb::enumerable_thread_specific<DecodeWorker> per_thread;
};

namespace {

std::string param_where(const NodeSpec& spec, const std::string& key) {
  SourceLoc loc = spec.params.loc(key);
  return (loc.file.empty() ? spec.loc : loc).str();
}

std::vector<std::string> field_names(const std::vector<BytesField>& fields) {
  std::vector<std::string> names;
  for (const BytesField& f : fields) names.push_back(f.field);
  return names;
}

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

}  // namespace

WebDatasetLoader::WebDatasetLoader(WebDatasetOptions options)
    : options_(std::move(options)),
      index_(expand_shards(options_.shards), field_names(options_.bytes_fields)),
      workers_(std::make_unique<DecodeWorkers>()) {
  if (index_.samples().empty()) {
    throw DataError(fmt::format("shards: '{}' hold no sample", fmt::join(options_.shards, ", ")));
  }
  for (const std::string& path : index_.shards()) {
    try {
      fds_.push_back(DataFile(path).release());
    } catch (...) {
      for (int f : fds_) ::close(f);
      throw;
    }
  }
  target_.width = options_.width;
  target_.height = options_.height;
  target_.channels = options_.channels;
  target_.chw = options_.chw;
  target_.dct_scaling = options_.dct_scaling;
  sample_bytes_ = static_cast<std::size_t>(options_.width) *
                  static_cast<std::size_t>(options_.height) *
                  static_cast<std::size_t>(options_.channels);
}

WebDatasetLoader::~WebDatasetLoader() {
  for (int fd : fds_) ::close(fd);
}

WebDatasetOptions WebDatasetLoader::options_from(const NodeSpec& spec) {
  const Params& p = spec.params;
  WebDatasetOptions o;
  o.shards = p.get_string_list("shards");
  o.height = static_cast<int>(p.get_int("height"));
  o.width = static_cast<int>(p.get_int("width"));
  o.channels = static_cast<int>(p.get_int("channels"));
  o.chw = p.get_string("layout") == "chw";
  o.crop = p.get_string("crop") == "center" ? ImageCrop::center : ImageCrop::random_resized;
  o.scale_min = p.get_number("scale_min");
  o.scale_max = p.get_number("scale_max");
  o.ratio_min = p.get_number("ratio_min");
  o.ratio_max = p.get_number("ratio_max");
  o.resize = static_cast<int>(p.get_int("resize"));
  if (o.resize == 0) o.resize = static_cast<int>(std::lround(std::max(o.height, o.width) / 0.875));
  o.flip = p.get_number("flip");
  o.seed = static_cast<std::uint64_t>(p.get_int("seed"));
  o.dct_scaling = p.get_bool("dct_scaling");
  o.num_classes = static_cast<int>(p.get_int("num_classes"));
  o.parallel = p.get_bool("parallel");
  o.max_pixels = static_cast<std::uint64_t>(p.get_int("max_pixels"));
  std::vector<std::string> problems;
  parse_bytes_fields(spec, o, problems);
  if (o.channels != 1 && o.channels != 3) {
    problems.push_back(
        fmt::format("{}: nodes.{}.params.channels: {} is not supported (1: gray, "
                    "3: RGB)",
                    param_where(spec, "channels"), spec.name, o.channels));
  }
  if (o.scale_min > o.scale_max) {
    problems.push_back(
        fmt::format("{}: nodes.{}.params.scale_min: {} is above scale_max {} (the "
                    "area fraction range must not be empty)",
                    param_where(spec, "scale_min"), spec.name, o.scale_min, o.scale_max));
  }
  if (o.ratio_min > o.ratio_max) {
    problems.push_back(
        fmt::format("{}: nodes.{}.params.ratio_min: {} is above ratio_max {} (the "
                    "aspect ratio range must not be empty)",
                    param_where(spec, "ratio_min"), spec.name, o.ratio_min, o.ratio_max));
  }
  if (o.crop == ImageCrop::center && o.resize < std::min(o.height, o.width)) {
    problems.push_back(
        fmt::format("{}: nodes.{}.params.resize: {} is smaller than the crop {}x{} "
                    "(the center crop must fit in the resized image)",
                    param_where(spec, "resize"), spec.name, o.resize, o.height, o.width));
  }
  if (!problems.empty()) throw ConfigError(std::move(problems));
  return o;
}

std::vector<TensorSpec> WebDatasetLoader::sample_tensors() const {
  const std::int64_t h = options_.height;
  const std::int64_t w = options_.width;
  const std::int64_t c = options_.channels;
  std::vector<std::int64_t> shape =
      options_.chw ? std::vector<std::int64_t>{c, h, w} : std::vector<std::int64_t>{h, w, c};
  std::vector<TensorSpec> tensors = {TensorSpec{"x", DType::uint8, std::move(shape)},
                                     TensorSpec{"y", DType::int32, {}}};
  for (const BytesField& f : options_.bytes_fields) {
    tensors.push_back({f.field, DType::uint8, {static_cast<std::int64_t>(f.max_bytes)}});
    tensors.push_back({f.field + "_len", DType::int32, {}});
  }
  return tensors;
}

void WebDatasetLoader::setup(BuildContext& context) {
  const PipelineOptions& pipeline = context.pipeline_options();
  skip_ = pipeline.on_error == OnError::skip;
  node_name_ = context.spec().name;
  drops_.set_who(fmt::format("node '{}' (webdataset)", node_name_));
  max_skipped_ = pipeline.max_skipped;
  if (!skip_) {
    // Without skip a sample that the headers already show to be unusable would fail its batch
    // later: say so now, before the run starts.
    for (const ShardSample& s : index_.samples()) {
      if (s.problem != SampleProblem::none) {
        throw DataError(index_.where(s) + ": " + index_.problem_text(s) +
                        " (set pipeline.on_error: skip to drop such samples)");
      }
    }
  }
  pool_ = &context.make_pool("host", MemoryKind::pageable,
                             static_cast<std::size_t>(context.prefetch_depth()),
                             context.layout().capacity(), Allocator::host());
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
  try {
    const ImageSize size = w.decoder.size(w.encoded.data(), s.image_bytes, s.format);
    // From the header, before a byte is decoded: the decoder's buffers grow with the image.
    const std::uint64_t pixels =
        static_cast<std::uint64_t>(size.width) * static_cast<std::uint64_t>(size.height);
    if (pixels > options_.max_pixels) {
      throw DataError(fmt::format(
          "{}: the image declares {}x{} = {} pixels, more than max_pixels = {} (a decompression "
          "bomb, or a larger image than expected: raise nodes.{}.params.max_pixels to accept it)",
          index_.where(s), size.width, size.height, pixels, options_.max_pixels, node_name_));
    }
    CropBox box;
    if (options_.crop == ImageCrop::random_resized) {
      SampleRng rng(options_.seed, epoch, sample, kCropSalt);
      box = random_resized_crop(size.width, size.height, options_.scale_min, options_.scale_max,
                                options_.ratio_min, options_.ratio_max, rng);
    } else {
      box = center_crop(size.width, size.height, options_.resize, options_.width, options_.height);
    }
    // The crop, resize, flip and layout happen in one pass that writes the batch's row.
    const bool flip = flip_choice(options_.seed, epoch, sample, options_.flip);
    w.decoder.decode(w.encoded.data(), s.image_bytes, s.format, size, box, target_, flip, row.x);
  } catch (const DecodeError& e) {
    throw DataError(index_.where(s) + ": " + e.what());
  }
}

void WebDatasetLoader::process(Batch& batch) {
  batch.host = pool_->acquire();
  const std::size_t rows = batch.rows();
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
  std::mutex failures_mutex;
  std::vector<Failure> failures;  // allocates only when a sample fails
  auto one = [&](std::size_t row) {
    try {
      load_sample(batch.samples[row], batch.epoch, targets(row));
    } catch (const DataError& e) {
      std::lock_guard<std::mutex> lock(failures_mutex);
      failures.push_back({row, e.what(), true});
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(failures_mutex);
      failures.push_back({row, e.what(), false});
    }
  };
  if (options_.parallel && rows > 1) {
    tbb::parallel_for(std::size_t{0}, rows, one);
  } else {
    for (std::size_t row = 0; row < rows; ++row) one(row);
  }
  if (failures.empty()) return;
  // The first failing row decides, whatever the threads' timing.
  std::sort(failures.begin(), failures.end(),
            [](const Failure& a, const Failure& b) { return a.row < b.row; });
  for (const Failure& f : failures) {
    if (!f.data_error) throw std::runtime_error(f.message);
  }
  if (!skip_) throw DataError(failures.front().message);
  drop_rows(batch, failures);
}

void WebDatasetLoader::drop_rows(Batch& batch, std::vector<Failure>& failures) {
  const std::size_t rows = batch.rows();
  // Every dropped sample counts, one by one, against max_skipped, and is said once.
  for (const Failure& f : failures) {
    drops_.note(fmt::format("sample {} of batch {} (epoch {}): {}", batch.samples[f.row], batch.seq,
                            batch.epoch, f.message));
  }
  const std::uint64_t dropped = drops_.count();
  if (dropped > static_cast<std::uint64_t>(max_skipped_)) {
    throw std::runtime_error(fmt::format("{} ({} {} dropped, more than pipeline.max_skipped = {})",
                                         failures.front().message, dropped,
                                         dropped == 1 ? "sample" : "samples", max_skipped_));
  }
  if (failures.size() == rows) {
    // Nothing left to deliver: the batch is skipped as a whole, its samples counted above.
    throw BatchDroppedError(
        fmt::format("every sample of the batch is bad; the first: {}", failures.front().message));
  }
  // Move the good rows down over the dropped ones, tensor by tensor, to where a batch of the new
  // row count keeps them (BatchLayout packs a shorter batch just as tightly). A tensor's new place
  // starts no later than its old one and ends before the next tensor's old place, so copying the
  // tensors in order, each row forward, never overwrites a byte still to be read.
  auto* base = reinterpret_cast<std::uint8_t*>(batch.data(Tier::host));
  const BatchLayout& layout = *batch.layout;
  const std::size_t kept_rows = rows - failures.size();
  for (std::size_t t = 0; t < layout.tensors().size(); ++t) {
    const std::size_t bytes = layout.tensors()[t].sample_bytes();
    const std::uint8_t* from = base + layout.offset(t, rows);
    std::uint8_t* to = base + layout.offset(t, kept_rows);
    std::size_t kept = 0;
    std::size_t next_failure = 0;
    for (std::size_t row = 0; row < rows; ++row) {
      if (next_failure < failures.size() && failures[next_failure].row == row) {
        ++next_failure;
        continue;
      }
      if (to + kept * bytes != from + row * bytes) {
        std::memmove(to + kept * bytes, from + row * bytes, bytes);
      }
      if (t == 0) batch.samples[kept] = batch.samples[row];
      ++kept;
    }
  }
  const std::size_t kept = kept_rows;
  batch.samples.resize(kept);
}

void WebDatasetLoader::finish(RunReport& report) {
  drops_.finish(report);
}

}  // namespace flowfeed
