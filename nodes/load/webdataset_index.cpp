#include "flowfeed/nodes/detail/webdataset_index.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <limits>

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

}  // namespace

std::vector<std::string> expand_shards(const std::vector<std::string>& shards) {
  std::shared_ptr<RemoteFiles> none;
  return expand_shards(shards, RemoteOptions{}, none);
}

std::vector<std::string> expand_shards(const std::vector<std::string>& shards,
                                       const RemoteOptions& options,
                                       std::shared_ptr<RemoteFiles>& remote) {
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
  RemoteSource source{options, remote};
  std::vector<std::string> files = expand_file_set(patterns, "shards", &source);
  remote = source.files;
  return files;
}

WebDatasetIndex::WebDatasetIndex(std::vector<std::string> shards, std::vector<std::string> fields)
    : shards_(std::move(shards)), fields_(std::move(fields)) {
  for (std::string& f : fields_) f = lower(f);
  for (std::uint32_t shard = 0; shard < shards_.size(); ++shard) {
    const TarListing listing = read_tar_listing(shards_[shard]);
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
          throw DataError(
              fmt::format("{}: member '{}' at offset {}: {} bytes is too large an image",
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
      if (s.problem == SampleProblem::no_field)
        s.missing_field = static_cast<std::uint8_t>(missing);
      s.name_at = static_cast<std::uint32_t>(names_.size());
      s.name_len = static_cast<std::uint16_t>(std::min<std::size_t>(named.name.size(), 65535));
      s.key_len = static_cast<std::uint16_t>(std::min<std::size_t>(key.size(), s.name_len));
      names_.insert(names_.end(), named.name.begin(), named.name.begin() + s.name_len);
      samples_.push_back(s);
      i = end;
    }
  }
  if (samples_.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw DataError(fmt::format("shards: {} samples is more than the 2^32 - 1 a sampler addresses",
                                samples_.size()));
  }
}

std::string WebDatasetIndex::where(const ShardSample& s) const {
  return fmt::format("{}: sample '{}' (member '{}' at offset {})",
                     shown_.empty() ? shards_[s.shard] : shown_[s.shard], key(s), name(s),
                     s.image_header);
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
