#include "flowfeed/checkpoint.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "detail/checkpoint_files.hpp"
#include "detail/shard_order.hpp"
#include "flowfeed/memory_budget.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed {

namespace {

namespace fs = std::filesystem;
using detail::fnv1a64;
using detail::hex64;
using json = nlohmann::ordered_json;

constexpr const char* kFormat = "flowfeed checkpoint";

/// The node file at `path`, which the manifest's `field` names, read with the bounds of every
/// checkpoint file; a problem is a ConfigError naming the manifest and the field.
std::string read_node_file(const std::string& path, std::size_t limit, const std::string& manifest,
                           const std::string& field) {
  try {
    return detail::read_checkpoint_file(path, limit, "checkpoint node state");
  } catch (const ConfigError& e) {
    throw ConfigError({fmt::format("{}: {}: {}", manifest, field, e.what())});
  }
}

/// `text` cut to a readable length for a message, on a UTF-8 character boundary.
std::string cut(const std::string& text) {
  constexpr std::size_t kShown = 60;
  if (text.size() <= kShown) return text;
  std::size_t at = kShown;
  while (at > 0 && (static_cast<unsigned char>(text[at]) & 0xc0) == 0x80) --at;
  return fmt::format("{}… ({} bytes)", text.substr(0, at), text.size());
}

/// `value` as JSON for a message, cut to a readable length (a corrupt file may hold megabytes).
std::string shown(const json& value) {
  return cut(value.dump());
}

/// Reads fields of a parsed manifest (or of one object in it, whose keys `prefix` leads in
/// messages); every problem names the file and the field.
class Fields final : public CursorFields {
 public:
  Fields(const json& root, std::string file, std::string prefix = "")
      : root_(root), file_(std::move(file)), prefix_(std::move(prefix)) {}

  std::string noun() const override { return "checkpoint"; }
  std::string remedy() const override { return "resume from a complete one"; }
  std::string other_kind_remedy() const override {
    return "point pipeline.resume_from at a directory --checkpoint wrote";
  }
  std::string newer_remedy() const override { return "resume with the flowfeed that wrote it"; }
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const override {
    throw ConfigError({fmt::format("{}: {}{}: {}", file_, prefix_, key, problem)});
  }
  std::string shown(const std::string& key) const override {
    const json* v = find(key);
    return v ? flowfeed::shown(*v) : std::string("nothing");
  }
  std::string quoted(const std::string& text) const override { return json(text).dump(); }
  const json& at(const std::string& key) const {
    const json* v = find(key);
    if (!v)
      fail(key, "missing (the checkpoint is incomplete or corrupt) resume from a complete one");
    return *v;
  }
  std::uint64_t count(const std::string& key) const override {
    return value<std::uint64_t>(key, &json::is_number_unsigned, "a non-negative integer");
  }
  bool flag(const std::string& key) const override {
    return value<bool>(key, &json::is_boolean, "true or false");
  }
  std::string text(const std::string& key) const override {
    return value<std::string>(key, &json::is_string, "a string");
  }
  std::vector<std::uint64_t> counts(const std::string& key) const override {
    const json& list = at(key);
    std::vector<std::uint64_t> out;
    for (const json& v : list.is_array() ? list : json::array({json()})) {
      if (!v.is_number_unsigned()) {
        fail(key, fmt::format("expected a list of non-negative integers, found {} {}",
                              flowfeed::shown(list), corrupt()));
      }
      out.push_back(v.get<std::uint64_t>());
    }
    return out;
  }
  bool text_is(const std::string& key, const std::string& value) const override {
    const json* v = find(key);
    return v && v->is_string() && v->get<std::string>() == value;
  }

 private:
  const json* find(const std::string& key) const {
    const json* node = &root_;
    std::size_t begin = 0;
    for (;;) {
      const std::size_t dot = key.find('.', begin);
      const std::string part = key.substr(begin, dot - begin);
      if (!node->is_object() || !node->contains(part)) return nullptr;
      node = &(*node)[part];
      if (dot == std::string::npos) return node;
      begin = dot + 1;
    }
  }
  /// The field at `key` as a T; a field that `holds` rejects is an error that says it expected
  /// `what`.
  template <typename T>
  T value(const std::string& key, bool (json::*holds)() const noexcept, const char* what) const {
    const json& v = at(key);
    if (!(v.*holds)()) {
      fail(key, fmt::format("expected {}, found {} {}", what, flowfeed::shown(v), corrupt()));
    }
    return v.get<T>();
  }

  const json& root_;
  std::string file_;
  std::string prefix_;
};

std::string manifest_path(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) ? (fs::path(path) / kCheckpointManifest).string() : path;
}

}  // namespace

std::string expand_rank(std::string path, int rank) {
  const std::string token = "{rank}";
  for (std::size_t at = path.find(token); at != std::string::npos; at = path.find(token, at)) {
    const std::string r = std::to_string(rank);
    path.replace(at, token.size(), r);
    at += r.size();
  }
  return path;
}

std::string checkpoint_json(const Checkpoint& c) {
  json j;
  j["format"] = kFormat;
  const bool shards = c.order == SampleOrder::shards;
  j["version"] = shards ? 2 : 1;
  j["sampler"] = {{"seed", c.seed},
                  {"shuffle", c.shuffle},
                  {"drop_last", c.drop_last},
                  {"dataset_size", c.dataset_size}};
  if (shards) {
    j["sampler"]["order"] = "shards";
    j["sampler"]["shuffle_window"] = c.shuffle_window;
    j["sampler"]["data_shards"] = c.data_shards;
  }
  j["cursor"] = {{"epoch", c.epoch},
                 {"samples", c.samples},
                 {"world", c.world},
                 {"rank", c.rank},
                 {"batch_size", c.batch_size},
                 {"global_batch", c.global_batch},
                 {"finished_ahead", c.finished_ahead},
                 {"steps", c.steps}};
  j["nodes"] = json::object();
  for (const auto& [name, f] : c.nodes) {
    j["nodes"][name] = {
        {"type", f.type}, {"file", f.file}, {"bytes", f.bytes}, {"fnv1a64", hex64(f.fnv1a64)}};
  }
  return j.dump(2) + "\n";
}

Checkpoint read_checkpoint(const std::string& path) {
  const std::string file = manifest_path(path);
  const std::string text =
      detail::read_checkpoint_file(file, kMaxManifestBytes, "checkpoint manifest");
  if (const std::size_t nesting = detail::json_nesting(text);
      nesting > detail::kMaxCheckpointNesting) {
    throw ConfigError(
        {fmt::format("{}: not a checkpoint: nested {} levels deep (a manifest nests "
                     "3; the file is corrupt) resume from a complete checkpoint",
                     file, nesting)});
  }
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 6, column 17: syntax error ...", or a
    // number beyond a double: "[json.exception.out_of_range.406] number overflow parsing '1e3001'"
    std::string what = e.what();
    std::string where = file;
    unsigned line = 0, column = 0;
    const std::size_t at = what.find(" at line ");
    if (at != std::string::npos &&
        std::sscanf(what.c_str() + at, " at line %u, column %u", &line, &column) == 2) {
      where = fmt::format("{}:{}:{}", file, line, column);
    }
    if (at != std::string::npos) {
      const std::size_t colon = what.find(": ", at);
      if (colon != std::string::npos) what = what.substr(colon + 2);
    } else if (what.rfind("[json.exception.", 0) == 0 && what.find("] ") != std::string::npos) {
      what = what.substr(what.find("] ") + 2);
    }
    throw ConfigError(
        {fmt::format("{}: not a checkpoint: {} (the file is truncated or corrupt) "
                     "resume from a complete checkpoint",
                     where, what)});
  }
  const Fields f(root, file);
  Checkpoint c = read_cursor(f, kFormat);
  const json& nodes = f.at("nodes");
  if (!nodes.is_object()) {
    f.fail("nodes", fmt::format("expected an object, found {} (the checkpoint is corrupt) resume "
                                "from a complete one",
                                shown(nodes)));
  }
  c.dir = fs::path(file).parent_path().string();
  for (const auto& [name, entry] : nodes.items()) {
    // The entry's own fields, so that a name with dots or of any length is found.
    const Fields n(entry, file, "nodes." + cut(name) + ".");
    NodeStateFile s;
    s.type = n.text("type");
    s.file = n.text("file");
    s.bytes = n.count("bytes");
    const std::string hash = n.text("fnv1a64");
    if (s.file.empty() || s.file == "." || s.file == ".." ||
        s.file.find('/') != std::string::npos) {
      n.fail("file", fmt::format("'{}' is not a file name inside the checkpoint", cut(s.file)));
    }
    try {
      std::size_t used = 0;
      s.fnv1a64 = std::stoull(hash, &used, 16);
      if (used != hash.size()) throw std::invalid_argument(hash);
    } catch (const std::exception&) {
      n.fail("fnv1a64", fmt::format("'{}' is not a hexadecimal hash", cut(hash)));
    }
    c.nodes[name] = s;
  }
  // The node files must be whole: they are read again when the nodes load them.
  for (const auto& [name, s] : c.nodes) read_node_state(c, name);
  return c;
}

std::string read_node_state(const Checkpoint& c, const std::string& name) {
  const std::string manifest = (fs::path(c.dir) / kCheckpointManifest).string();
  auto it = c.nodes.find(name);
  if (it == c.nodes.end()) {
    throw ConfigError(
        {fmt::format("{}: nodes.{}: missing (the checkpoint has no state for node "
                     "'{}', which keeps some) resume from a checkpoint of this "
                     "pipeline",
                     manifest, name, name)});
  }
  const NodeStateFile& s = it->second;
  const std::string key = "nodes." + cut(name);
  const std::string path = (fs::path(c.dir) / s.file).string();
  struct stat st;
  // A file of another size is named as such, unread; one that grows while read stops at the size.
  const bool sized = ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  if (sized && static_cast<std::uint64_t>(st.st_size) == s.bytes) {
    // A state is read whole: one larger than the memory there is ends in bad_alloc or the OOM
    // killer, not in a message.
    const MemoryAvailable available = available_memory();
    if (available.host && s.bytes > *available.host) {
      throw ConfigError(
          {fmt::format("{}: {}.bytes: {} holds {}, more than the {} of memory available ({}) "
                       "resume on a machine with more memory, or from a checkpoint of this "
                       "pipeline",
                       manifest, key, s.file, format_bytes(s.bytes), format_bytes(*available.host),
                       available.host_source)});
    }
  }
  const std::string bytes =
      sized && static_cast<std::uint64_t>(st.st_size) != s.bytes
          ? std::string()
          : read_node_file(path, static_cast<std::size_t>(s.bytes), manifest, key + ".file");
  if (sized && static_cast<std::uint64_t>(st.st_size) != s.bytes) {
    throw ConfigError(
        {fmt::format("{}: {}.bytes: {} has {} bytes, the checkpoint says {} (the "
                     "file is truncated or corrupt) resume from a complete checkpoint",
                     manifest, key, s.file, static_cast<std::uint64_t>(st.st_size), s.bytes)});
  }
  if (bytes.size() != s.bytes) {
    throw ConfigError(
        {fmt::format("{}: {}.bytes: {} has {} bytes, the checkpoint says {} (the "
                     "file is truncated or corrupt) resume from a complete checkpoint",
                     manifest, key, s.file, bytes.size(), s.bytes)});
  }
  if (fnv1a64(bytes) != s.fnv1a64) {
    throw ConfigError(
        {fmt::format("{}: {}.fnv1a64: {} hashes to {}, the checkpoint says {} (the "
                     "file is corrupt) resume from a complete checkpoint",
                     manifest, key, s.file, hex64(fnv1a64(bytes)), hex64(s.fnv1a64))});
  }
  return bytes;
}

ResumePoint resume_point(const Checkpoint& c, const Sampler& sampler, std::uint32_t epochs,
                         const std::string& where) {
  const SamplerOptions& o = sampler.options();
  auto fail = [&](const std::string& key, const std::string& problem) {
    throw ConfigError({fmt::format("{}: {}: {}", where, key, problem)});
  };
  if ((c.dataset_size == 0) != sampler.stream()) {
    // dataset_size 0: written by a stream of unknown length (Sampler::stream).
    fail("sampler.dataset_size",
         c.dataset_size == 0
             ? fmt::format("the checkpoint was written by a stream of unknown length, this run's "
                           "data set has {} samples (a stream's position is a count of samples "
                           "read, not a place in a data set of known size) resume with the same "
                           "stream (python_iterable without samples)",
                           sampler.dataset_size())
             : fmt::format("the checkpoint was written for {} samples, this run reads a stream of "
                           "unknown length (its epochs end where its data does, so a position in "
                           "a data set of known size says nothing about it) resume with the same "
                           "data set",
                           c.dataset_size));
  }
  if (c.dataset_size != sampler.dataset_size()) {
    fail("sampler.dataset_size",
         fmt::format("the checkpoint was written for {} samples, this run's data set has {} (a "
                     "resume continues the same sample order) resume with the same data set",
                     c.dataset_size, sampler.dataset_size()));
  }
  if (c.shuffle != o.shuffle) {
    fail("sampler.shuffle", fmt::format("the checkpoint was written with shuffle: {}, this run has "
                                        "shuffle: {} (a resume continues the same sample order) "
                                        "set sampler.shuffle: {}",
                                        c.shuffle, o.shuffle, c.shuffle));
  }
  if (c.shuffle && c.seed != o.seed) {
    fail("sampler.seed", fmt::format("the checkpoint was written with seed {}, this run has seed "
                                     "{} (every epoch's order comes from the seed) set "
                                     "sampler.seed: {}",
                                     c.seed, o.seed, c.seed));
  }
  detail::check_shard_order(c, sampler, where);
  if (c.drop_last != o.drop_last) {
    fail("sampler.drop_last",
         fmt::format("the checkpoint was written with drop_last: {}, this run has drop_last: {} "
                     "(it decides which batches an epoch has) set sampler.drop_last: {}",
                     c.drop_last, o.drop_last, c.drop_last));
  }
  const std::uint64_t global = sampler.global_batch();
  if (c.global_batch != global) {
    const bool divides = c.global_batch % static_cast<std::uint64_t>(o.world) == 0;
    fail("cursor.global_batch",
         fmt::format("the checkpoint was written by world {} x batch_size {} = global batch {}, "
                     "this run is world {} x batch_size {} = {} (a resume keeps the global batch, "
                     "so that every global step trains on the same samples) {}",
                     c.world, c.batch_size, c.global_batch, o.world, sampler.batch_size(), global,
                     divides ? fmt::format("set pipeline.batch_size: {}",
                                           c.global_batch / static_cast<std::uint64_t>(o.world))
                             : fmt::format("use a world size that divides {}", c.global_batch)));
  }
  if (!c.finished_ahead.empty() && c.world != o.world) {
    fail("cursor.finished_ahead",
         fmt::format("rank {} of {} had finished {} batches after the cursor out of order, which "
                     "a world of {} cannot map to its shards resume with world {}, or from a "
                     "checkpoint written after a drain (SIGTERM) or with pipeline.ordered: true",
                     c.rank, c.world, c.finished_ahead.size(), o.world, c.world));
  }
  if (!c.finished_ahead.empty() && c.rank != o.rank) {
    // The offsets are of that rank's own sequence: on another rank they would skip batches of
    // this rank's shard that were never trained.
    fail("cursor.rank",
         fmt::format("the checkpoint was written by rank {} with {} batches finished after the "
                     "cursor out of order, this run is rank {} (those batches are of rank {}'s "
                     "shard) resume rank {} from rank {}'s checkpoint (--resume DIR with {{rank}})",
                     c.rank, c.finished_ahead.size(), o.rank, c.rank, o.rank, o.rank));
  }
  const std::uint64_t per_epoch = sampler.batches_per_epoch();
  const std::uint64_t index = c.samples / global;
  // Every figure below is checked against the run's end before it is added to or multiplied.
  const std::uint64_t end = checked_mul(epochs, per_epoch).value_or(~0ull);
  ResumePoint p;
  // A rank with no batch left in the cursor's epoch starts the next one.
  const std::uint64_t epoch = index < per_epoch ? c.epoch : c.epoch + 1ull;
  if (epoch >= epochs) {
    fail("cursor.epoch",
         fmt::format("the checkpoint is at epoch {}, sample {} of its order: nothing of this "
                     "run's {} epochs is left after it (allowed: an epoch below pipeline.epochs "
                     "with a batch of this rank left in it) raise pipeline.epochs to train "
                     "further, or start without pipeline.resume_from",
                     c.epoch, c.samples, epochs));
  }
  p.first = epoch * per_epoch + (index < per_epoch ? index : 0);
  const std::uint64_t after = end - p.first - 1;  // batches of the run after the first
  if (!c.finished_ahead.empty() && c.finished_ahead.back() > after) {
    fail("cursor.finished_ahead",
         fmt::format("{} is past the end of the run: {} batches of this rank follow the cursor's "
                     "in {} epochs (allowed: ascending offsets 1 to {}; the checkpoint is corrupt "
                     "or from a longer run) resume from a complete checkpoint of this run",
                     c.finished_ahead.back(), after, epochs, after));
  }
  if (c.steps > ~0ull - end) {
    fail("cursor.steps",
         fmt::format("{} is out of range (allowed: 0 to {}, so that the count of a run of {} "
                     "batches fits 64 bits; the checkpoint is corrupt) resume from a complete one",
                     c.steps, ~0ull - end, end));
  }
  for (std::uint64_t a : c.finished_ahead) p.skip.push_back(p.first + a);
  return p;
}

Checkpoint make_checkpoint(const Sampler& sampler, std::uint64_t next,
                           const std::vector<std::uint64_t>& ahead, std::uint64_t steps) {
  const SamplerOptions& o = sampler.options();
  Checkpoint c;
  c.seed = o.seed;
  c.shuffle = o.shuffle;
  c.drop_last = o.drop_last;
  c.dataset_size = sampler.dataset_size();
  if (o.order == SampleOrder::shards) {
    c.order = SampleOrder::shards;
    c.shuffle_window = static_cast<std::uint64_t>(o.shuffle_window);
    c.data_shards = sampler.data_shards();
  }
  const std::uint64_t per_epoch = sampler.batches_per_epoch();
  c.epoch = static_cast<std::uint32_t>(next / per_epoch);
  c.samples = (next % per_epoch) * sampler.global_batch();
  c.world = o.world;
  c.rank = o.rank;
  c.batch_size = sampler.batch_size();
  c.global_batch = sampler.global_batch();
  for (std::uint64_t a : ahead) c.finished_ahead.push_back(a - next);
  c.steps = steps;
  return c;
}

}  // namespace flowfeed
