#include "flowfeed/nodes/detail/webdataset_index.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <sstream>

#include "flowfeed/data_file.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/nodes/detail/file_set.hpp"
#include "flowfeed/nodes/detail/tar_index.hpp"
#include "flowfeed/nodes/webdataset.hpp"

namespace flowfeed {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

/// The key and field of a member path: "dir/abc.seg.jpg" → ("dir/abc", "seg.jpg").
std::pair<std::string_view, std::string_view> split_key(std::string_view name) {
  const std::size_t slash = name.rfind('/');
  const std::size_t dot = name.find('.', slash == std::string_view::npos ? 0 : slash + 1);
  if (dot == std::string_view::npos) return {name, {}};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

/// Reads the next line of `in` into `line` (without its newline); false at the end of the file.
/// Stops at `limit` bytes: returns true with `line` holding them and `too_long` set.
bool bounded_line(std::FILE* in, std::string& line, std::size_t limit, bool& too_long) {
  line.clear();
  for (int c = std::getc(in); c != EOF; c = std::getc(in)) {
    if (c == '\n') return true;
    if (line.size() == limit) {
      too_long = true;
      return true;
    }
    line.push_back(static_cast<char>(c));
  }
  return !line.empty();
}

}  // namespace

std::vector<std::string> expand_shards(const std::vector<std::string>& shards) {
  std::shared_ptr<RemoteFiles> none;
  return expand_shards(shards, RemoteOptions{}, none);
}

std::vector<std::string> expand_shards(const std::vector<std::string>& shards,
                                       const RemoteOptions& options,
                                       std::shared_ptr<RemoteFiles>& remote, bool defer) {
  // WebDataset's convention: one string may list several shards, separated by commas or spaces
  // (a comma inside braces belongs to the brace list).
  std::vector<std::string> patterns;
  for (const std::string& text : shards) {
    std::string token;
    int depth = 0;
    for (char c : text) {
      if (c == '{') ++depth;
      if (c == '}' && depth > 0) --depth;
      if ((c == ',' && depth == 0) || std::isspace(static_cast<unsigned char>(c))) {
        if (!token.empty()) patterns.push_back(std::move(token));
        token.clear();
      } else {
        token += c;
      }
    }
    if (!token.empty()) patterns.push_back(std::move(token));
  }
  RemoteSource source{options, remote, defer};
  std::vector<std::string> files = expand_file_set(patterns, "shards", &source);
  remote = source.files;
  return files;
}

WebDatasetIndex::WebDatasetIndex(std::vector<std::string> shards, std::vector<std::string> fields)
    : WebDatasetIndex(std::move(shards), std::move(fields), {}) {}

WebDatasetIndex::WebDatasetIndex(std::vector<std::string> shards, std::vector<std::string> fields,
                                 const std::function<TarListing(std::size_t shard)>& listing)
    : shards_(std::move(shards)), fields_(std::move(fields)) {
  for (std::string& f : fields_) f = lower(f);
  for (std::uint32_t shard = 0; shard < shards_.size(); ++shard) {
    starts_.push_back(samples_.size());
    add_shard(shard, listing ? listing(shard) : read_tar_listing(shards_[shard]));
  }
  starts_.push_back(samples_.size());
  if (samples_.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw DataError(fmt::format("shards: {} samples is more than the 2^32 - 1 a sampler addresses",
                                samples_.size()));
  }
}

void WebDatasetIndex::add_shard(std::uint32_t shard, const TarListing& listing) {
  const auto& members = listing.members;
  std::size_t i = 0;
  while (i < members.size()) {
    const std::string_view key = split_key(members[i].name).first;
    std::size_t end = i + 1;
    while (end < members.size() && split_key(members[end].name).first == key) ++end;
    ShardSample s;
    s.shard = shard;
    const TarMember* image = nullptr;
    const TarMember* label = nullptr;
    const TarMember* cut = nullptr;
    const std::size_t at = fields_at_.size();
    fields_at_.resize(at + fields_.size());
    std::vector<bool> found(fields_.size(), false);
    for (std::size_t m = i; m < end; ++m) {
      const std::string field = lower(split_key(members[m].name).second);
      for (std::size_t f = 0; f < fields_.size(); ++f) {
        if (!found[f] && field == fields_[f]) {
          found[f] = true;
          fields_at_[at + f] = {members[m].offset, members[m].size};
        }
      }
      const std::string last = field.substr(field.rfind('.') + 1);
      if (members[m].cut_short) cut = &members[m];
      if (!image && (last == "jpg" || last == "jpeg" || last == "png")) {
        image = &members[m];
        s.format = last == "png" ? ImageFormat::png : ImageFormat::jpeg;
      }
      if (!label && field == "cls") label = &members[m];
    }
    const TarMember& named = cut ? *cut : image ? *image : members[i];
    if (image) {
      if (image->size > std::numeric_limits<std::uint32_t>::max()) {
        throw DataError(fmt::format("{}: member '{}' at offset {}: {} bytes is too large an image",
                                    shards_[shard], image->name, image->header, image->size));
      }
      s.image_offset = image->offset;
      s.image_bytes = static_cast<std::uint32_t>(image->size);
      max_image_bytes_ = std::max(max_image_bytes_, s.image_bytes);
    }
    if (label) {
      s.label_offset = label->offset;
      // A label is a short integer: 65 bytes is enough to tell that a member is too long.
      s.label_bytes = static_cast<std::uint32_t>(std::min<std::uint64_t>(label->size, 65));
    }
    s.image_header = named.header;
    const auto missing =
        static_cast<std::size_t>(std::find(found.begin(), found.end(), false) - found.begin());
    s.problem = cut                        ? SampleProblem::cut_short
                : !image                   ? SampleProblem::no_image
                : !label                   ? SampleProblem::no_label
                : missing < fields_.size() ? SampleProblem::no_field
                                           : SampleProblem::none;
    if (s.problem == SampleProblem::no_field) s.missing_field = static_cast<std::uint8_t>(missing);
    s.name_at = static_cast<std::uint32_t>(names_.size());
    s.name_len = static_cast<std::uint16_t>(std::min<std::size_t>(named.name.size(), 65535));
    s.key_len = static_cast<std::uint16_t>(std::min<std::size_t>(key.size(), s.name_len));
    names_.insert(names_.end(), named.name.begin(), named.name.begin() + s.name_len);
    samples_.push_back(s);
    i = end;
  }
}

std::string WebDatasetIndex::where(const ShardSample& s) const {
  return fmt::format("{}: sample '{}' (member '{}' at offset {})",
                     shown_.empty() ? shards_[s.shard] : shown_[s.shard], key(s), name(s),
                     s.image_header);
}

std::string WebDatasetIndex::difference(std::size_t shard, const WebDatasetIndex& other) const {
  const std::size_t first = starts_[shard];
  const std::size_t count = starts_[shard + 1] - first;
  if (other.samples_.size() != count) {
    return fmt::format("the index lists {} samples, the shard holds {}", count,
                       other.samples_.size());
  }
  for (std::size_t k = 0; k < count; ++k) {
    const ShardSample& a = samples_[first + k];
    const ShardSample& b = other.samples_[k];
    std::string what;
    if (key(a) != other.key(b)) {
      what = fmt::format("the index says its key is '{}', the shard '{}'", key(a), other.key(b));
    } else if (a.problem != b.problem || a.missing_field != b.missing_field) {
      what = fmt::format("the index says '{}', the shard '{}'",
                         a.problem == SampleProblem::none ? "usable" : problem_text(a),
                         b.problem == SampleProblem::none ? "usable" : other.problem_text(b));
    } else if (a.image_offset != b.image_offset || a.image_bytes != b.image_bytes ||
               a.format != b.format) {
      what = fmt::format("the index puts its image at offset {} ({} bytes), the shard at {} ({})",
                         a.image_offset, a.image_bytes, b.image_offset, b.image_bytes);
    } else if (a.label_offset != b.label_offset || a.label_bytes != b.label_bytes) {
      what = fmt::format("the index puts its label at offset {}, the shard at {}", a.label_offset,
                         b.label_offset);
    } else {
      for (std::size_t f = 0; f < fields_.size() && what.empty(); ++f) {
        const FieldLocation& x = field(first + k, f);
        const FieldLocation& y = other.field(k, f);
        if (x.offset != y.offset || x.size != y.size) {
          what = fmt::format("the index puts its .{} at offset {}, the shard at {}", fields_[f],
                             x.offset, y.offset);
        }
      }
    }
    if (!what.empty()) return fmt::format("sample {} ('{}'): {}", k, other.key(b), what);
  }
  return {};
}

TarListing read_wds_index(const std::string& path, const std::string& shown,
                          std::uint64_t shard_bytes) {
  // Opened as a data file: a FIFO or a directory put in its place since the lists were expanded is
  // refused, not waited on.
  DataFile file(path);
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(::fdopen(file.fd(), "r"), &std::fclose);
  if (!in)
    throw DataError(
        fmt::format("{}: cannot read the index file ({})", shown, std::strerror(errno)));
  file.release();
  TarListing listing;
  listing.file_size = shard_bytes;
  std::string line;
  std::size_t number = 0;
  auto fail = [&](const std::string& what) {
    throw DataError(fmt::format("{}:{}: {}", shown, number, what));
  };
  auto parse = [&](const std::string& text, const char* what) {
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size()) {
      fail(fmt::format("{} '{}' is not a whole number", what, text));
    }
    return v;
  };
  std::uint64_t declared = 0;
  std::uint64_t lines = 0;
  std::uint64_t end_of_last = 0;
  // A sample's line: four fields a member, names of at most a few KiB. A longer line is no index.
  constexpr std::size_t kMaxLine = 65536;
  bool too_long = false;
  while (bounded_line(in.get(), line, kMaxLine, too_long)) {
    ++number;
    if (too_long) {
      fail(
          fmt::format("a line longer than {} bytes (a sample's line lists its members' "
                      "extensions, offsets, sizes and names)",
                      kMaxLine));
    }
    std::istringstream fields(line);
    std::vector<std::string> tokens{std::istream_iterator<std::string>(fields),
                                    std::istream_iterator<std::string>()};
    if (number == 1) {
      if (tokens.size() != 2 || tokens[0] != "v1.2") {
        fail(
            fmt::format("'{}' is not the header 'v1.2 <samples>' of a WebDataset index (the "
                        "format of DALI's wds2idx)",
                        line.substr(0, 40)));
      }
      declared = parse(tokens[1], "the sample count");
      continue;
    }
    if (tokens.empty()) continue;
    if (tokens.size() % 4 != 0) {
      fail(fmt::format("{} fields; a sample is groups of 'extension offset size name'",
                       tokens.size()));
    }
    ++lines;
    for (std::size_t g = 0; g < tokens.size(); g += 4) {
      TarMember m;
      m.offset = parse(tokens[g + 1], "offset");
      m.size = parse(tokens[g + 2], "size");
      m.name = tokens[g + 3];
      if (m.offset < 512 || m.offset % 512 != 0 || m.offset < end_of_last) {
        fail(
            fmt::format("member '{}' at offset {}: a member's data starts on a 512-byte block "
                        "after its header and after the member before it",
                        m.name, m.offset));
      }
      if (m.size > shard_bytes || m.offset > shard_bytes - m.size) {
        fail(fmt::format("member '{}' at offset {} of {} bytes runs past the shard's {} bytes",
                         m.name, m.offset, m.size, shard_bytes));
      }
      m.header = m.offset - 512;
      end_of_last = m.offset + m.size;
      listing.members.push_back(std::move(m));
    }
  }
  if (number == 0) fail("empty: not a WebDataset index");
  if (lines != declared) {
    throw DataError(fmt::format("{}: says {} samples and lists {}", shown, declared, lines));
  }
  return listing;
}

std::string WebDatasetIndex::problem_text(const ShardSample& s) const {
  switch (s.problem) {
    case SampleProblem::none: return {};
    case SampleProblem::no_image: return "no image member (.jpg, .jpeg or .png)";
    case SampleProblem::no_label: return "no label member (.cls)";
    case SampleProblem::no_field:
      return fmt::format("no .{} member (bytes_fields asks for it)", fields_[s.missing_field]);
    case SampleProblem::cut_short:
      return "the member is cut short (the shard ends before the size its header declares)";
  }
  return {};
}

}  // namespace flowfeed
