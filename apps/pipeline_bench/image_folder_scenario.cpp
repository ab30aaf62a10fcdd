// The image_folder scenario: the same JPEGs read two ways through the same graph. The WebDataset
// shards' images are written once as a class tree `root/<label>/<n>.jpg` (the class from each
// sample's .cls); then configs/images.yaml runs with its `webdataset` loader over the shards and
// with an `image_folder` loader over the tree (the same keys but `shards`, the same concurrency
// and threads), alternated `--repeats` times in one process (which goes first alternating too): the
// best images/s of each, and the images per CPU second of the whole process (which other work on
// the machine disturbs less).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "flowfeed/nodes/detail/webdataset_index.hpp"
#include "flowfeed/nodes/webdataset.hpp"

namespace flowfeed::bench {

namespace {

namespace fs = std::filesystem;

/// In the tree's root (image_folder ignores files there): what the tree was written from.
constexpr const char* kManifest = ".flowfeed_image_folder_bench";

/// The shards the tree is written from, as the manifest records them: each path and size.
std::string manifest_text(const WebDatasetIndex& index) {
  std::string text = "samples " + std::to_string(index.samples().size()) + "\n";
  for (const std::string& shard : index.shards()) {
    text += std::to_string(fs::file_size(shard)) + " " + fs::absolute(shard).string() + "\n";
  }
  return text;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// "00003": a class directory's name (sorted by name, the classes keep the labels' order).
std::string class_name(std::int64_t label) {
  char name[24];
  std::snprintf(name, sizeof name, "%05lld", static_cast<long long>(label));
  return name;
}

struct Tree {
  fs::path root;
  std::size_t images = 0;
  std::size_t classes = 0;
  std::size_t left_out = 0;  ///< samples with a problem in the shards: not written
  bool written = false;      ///< false: a tree written by an earlier run was reused
  double seconds = 0;        ///< writing it
};

/// The label of a sample from its .cls text, or -1 when it is not a non-negative integer (the
/// sample is left out: webdataset drops it as a bad sample too).
std::int64_t read_label(int fd, const ShardSample& s) {
  char text[64];
  if (s.label_bytes == 0 || s.label_bytes > sizeof text ||
      ::pread(fd, text, s.label_bytes, static_cast<off_t>(s.label_offset)) !=
          static_cast<ssize_t>(s.label_bytes)) {
    return -1;
  }
  std::string_view v(text, s.label_bytes);
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
  std::int64_t label = -1;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), label);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || label < 0 || label > 99999) {
    return -1;
  }
  return label;
}

/// Writes each usable sample's image of the shards as `partial/<class>/<n>.<ext>`.
void write_images(const WebDatasetIndex& index, const fs::path& partial, Tree& tree) {
  std::vector<int> fds(index.shards().size(), -1);
  struct Close {
    std::vector<int>& fds;
    ~Close() {
      for (int fd : fds) {
        if (fd >= 0) ::close(fd);
      }
    }
  } close{fds};
  std::vector<char> seen;  // by label: its directory exists
  std::vector<unsigned char> bytes;
  for (std::size_t i = 0; i < index.samples().size(); ++i) {
    const ShardSample& s = index.samples()[i];
    int& fd = fds[s.shard];
    if (fd < 0) fd = ::open(index.shards()[s.shard].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail_errno("cannot open", index.shards()[s.shard]);
    const std::int64_t label = s.problem == SampleProblem::none ? read_label(fd, s) : -1;
    if (label < 0) {
      ++tree.left_out;
      continue;
    }
    bytes.resize(s.image_bytes);
    if (::pread(fd, bytes.data(), bytes.size(), static_cast<off_t>(s.image_offset)) !=
        static_cast<ssize_t>(bytes.size())) {
      throw std::runtime_error(index.where(s) + "cannot be read");
    }
    const fs::path dir = partial / class_name(label);
    if (seen.size() <= static_cast<std::size_t>(label)) seen.resize(label + 1, 0);
    if (!seen[label]) {
      fs::create_directory(dir);
      seen[label] = 1;
      ++tree.classes;
    }
    char name[32];
    std::snprintf(name, sizeof name, "%08zu.%s", i, s.format == ImageFormat::png ? "png" : "jpg");
    const std::string path = (dir / name).string();
    const int out = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out < 0) fail_errno("cannot create", path);
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(out, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        ::close(out);
        fail_errno("cannot write", path);
      }
      done += static_cast<std::size_t>(n);
    }
    if (::close(out) != 0) fail_errno("cannot write", path);
    ++tree.images;
  }
}

/// Removes what write_images and write_tree wrote in `root` (class directories of 5 digits, files
/// of 8 digits and an image extension, the manifest), then `root` when that left it empty.
void remove_tree(const fs::path& root) {
  std::error_code ec;
  const auto digits = [](const std::string& s, std::size_t n) {
    return s.size() >= n &&
           std::all_of(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n),
                       [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  };
  for (const fs::directory_entry& c : fs::directory_iterator(root, ec)) {
    const std::string name = c.path().filename().string();
    if (!c.is_directory(ec) || c.is_symlink(ec) || name.size() != 5 || !digits(name, 5)) continue;
    for (const fs::directory_entry& f : fs::directory_iterator(c.path(), ec)) {
      const std::string file = f.path().filename().string();
      if (file.size() == 12 && digits(file, 8) &&
          (file.substr(8) == ".jpg" || file.substr(8) == ".png") && f.is_regular_file(ec)) {
        fs::remove(f.path(), ec);
      }
    }
    fs::remove(c.path(), ec);  // only when empty
  }
  fs::remove(root / kManifest, ec);
  fs::remove(root, ec);  // only when empty
}

/// The tree at `dir`: reused when this scenario wrote it from the same shards, else written (to a
/// sibling directory renamed into place, so a tree is never left half-written). A `dir` that
/// holds anything else is refused, never written into.
Tree write_tree(const WebDatasetIndex& index, const fs::path& dir) {
  Tree tree;
  tree.root = dir;
  const std::string manifest = manifest_text(index);
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (fs::exists(dir / kManifest, ec)) {
      const std::string found = read_text(dir / kManifest);
      const std::size_t end = found.find("\n---\n");
      if (end == std::string::npos || found.substr(0, end + 1) != manifest) {
        throw std::runtime_error(dir.string() +
                                 " holds a tree written from other shards (see its " + kManifest +
                                 ") remove it, or give another --dir");
      }
      std::istringstream counts(found.substr(end + 5));
      counts >> tree.images >> tree.classes >> tree.left_out;
      return tree;
    }
    if (!fs::is_directory(dir, ec) || !fs::is_empty(dir, ec)) {
      throw std::runtime_error(dir.string() +
                               " exists and is not a tree this scenario wrote (it has no " +
                               kManifest + ") give a new or empty --dir");
    }
  }
  const fs::path partial = dir.string() + ".partial-" + std::to_string(::getpid());
  if (!fs::create_directories(partial, ec) || ec) {
    throw std::runtime_error("cannot create " + partial.string() + ": " +
                             (ec ? ec.message() : std::string("it exists")));
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    write_images(index, partial, tree);
    if (tree.images == 0) throw std::runtime_error("the shards hold no usable image");
    std::ofstream out(partial / kManifest, std::ios::binary);
    out << manifest << "---\n"
        << tree.images << " " << tree.classes << " " << tree.left_out << "\n";
    out.close();
    if (!out) throw std::runtime_error("cannot write " + (partial / kManifest).string());
    // Onto a missing or empty directory: the tree appears whole or not at all.
    fs::rename(partial, dir);
  } catch (...) {
    remove_tree(partial);
    throw;
  }
  tree.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  tree.written = true;
  return tree;
}

/// `config` with its `webdataset` loader replaced by an `image_folder` one over `root`: the same
/// name, concurrency and every key the two types share.
PipelineConfig as_image_folder(const PipelineConfig& config, const fs::path& root,
                               const Registry& registry) {
  PipelineConfig out = config;
  NodeSpec& load = out.nodes.front();
  if (load.declared_type != "webdataset") {
    throw std::runtime_error("the config's loader '" + load.name + "' is " + load.declared_type +
                             ", not webdataset (give a --config like " + "configs/images.yaml)");
  }
  const NodeType* folder = registry.find("image_folder");
  if (!folder) throw std::runtime_error("the type image_folder is not registered");
  Params params;
  for (const auto& [name, value] : load.params.values()) {
    if (name != "root" && name != "file_list" && folder->schema.find(name)) {
      params.set(name, value, load.params.loc(name));
    }
  }
  params.set("root", root.string());
  load.params = std::move(params);
  load.type = load.declared_type = "image_folder";
  validate_config(out, registry);
  return out;
}

struct Rates {
  double images_per_second = 0;
  double images_per_cpu_second = 0;
};

}  // namespace

void image_folder(Bench& bench) {
  const Options& o = bench.options();
  if (!bench.has_image_shards("image_folder")) return;
  const Registry& registry = bench.registry();
  const WebDatasetIndex index(expand_shards({o.image_shards}));
  // A quick run (tests, perhaps several at once) writes a tree of its own.
  fs::path dir = o.folder_dir;
  if (dir.empty()) {
    dir = fs::temp_directory_path() /
          (o.quick ? "flowfeed_image_folder_bench_" + std::to_string(::getpid())
                   : std::string("flowfeed_image_folder_bench"));
  }
  const Tree tree = write_tree(index, dir);
  const auto cleanup = [&] {
    if (!o.folder_keep) remove_tree(tree.root);
  };
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = o.folder_threads > 0 ? o.folder_threads : (o.quick ? 2 : cores);
  const int epochs = o.quick ? 1 : o.image_epochs;
  const int repeats = o.quick ? 1 : o.folder_repeats;
  if (tree.written) {
    std::printf(
        "image_folder: wrote %zu images in %zu classes to %s in %.1f s (%zu samples left "
        "out)\n",
        tree.images, tree.classes, tree.root.c_str(), tree.seconds, tree.left_out);
  } else {
    std::printf("image_folder: reusing %s (%zu images in %zu classes)\n", tree.root.c_str(),
                tree.images, tree.classes);
  }
  nlohmann::json& details = bench.details("image_folder");
  details["shards"] = index.shards().size();
  details["samples"] = index.samples().size();
  details["tree"] = {{"root", tree.root.string()}, {"images", tree.images},
                     {"classes", tree.classes},    {"left_out", tree.left_out},
                     {"written", tree.written},    {"write_seconds", tree.seconds},
                     {"kept", o.folder_keep}};
  details["config"] = o.images_config;
  details["threads"] = threads;
  details["epochs"] = epochs;
  nlohmann::json& runs = details["runs"];
  runs = nlohmann::json::array();
  try {
    std::vector<std::string> overrides = {"nodes.load.params.shards=" + o.image_shards,
                                          "pipeline.threads=" + std::to_string(threads),
                                          "pipeline.epochs=" + std::to_string(epochs)};
    if (o.quick) {
      overrides.push_back("pipeline.batch_size=4");
      overrides.push_back("pipeline.prefetch_depth=3");
    }
    overrides.insert(overrides.end(), o.overrides.begin(), o.overrides.end());
    const PipelineConfig shards_config = load_config_file(o.images_config, registry, overrides);
    const PipelineConfig folder_config = as_image_folder(shards_config, tree.root, registry);
    Pipeline shards(shards_config, registry);
    // Building it walks the tree (the index): timed apart, in the report's load.index_seconds.
    Pipeline folder(folder_config, registry);
    std::printf("image_folder: %s, %d threads, loader concurrency %d, %d epochs, %d repeats\n",
                o.images_config.c_str(), threads, shards_config.nodes.front().concurrency, epochs,
                repeats);
    Rates best_shards, best_folder;
    const auto timed = [&](Pipeline& p, const char* what, Rates& best) {
      const double cpu_start = process_cpu_seconds();
      const RunReport r = p.run();
      const double cpu = process_cpu_seconds() - cpu_start;
      print_run(what, r);
      const Rates rates{r.samples_per_second, cpu > 0 ? static_cast<double>(r.samples) / cpu : 0};
      best.images_per_second = std::max(best.images_per_second, rates.images_per_second);
      best.images_per_cpu_second =
          std::max(best.images_per_cpu_second, rates.images_per_cpu_second);
      return std::make_pair(r, rates);
    };
    for (int i = 0; i < repeats; ++i) {
      // Which runs first alternates too (ABBA...): neither always runs after the other.
      std::optional<std::pair<RunReport, Rates>> first_folder;
      if (i % 2 == 1) first_folder = timed(folder, "image_folder tree", best_folder);
      const auto [s, s_rates] = timed(shards, "webdataset shards", best_shards);
      const auto [f, f_rates] =
          first_folder ? *first_folder : timed(folder, "image_folder tree", best_folder);
      std::printf("  images per CPU second: webdataset %.0f, image_folder %.0f\n",
                  s_rates.images_per_cpu_second, f_rates.images_per_cpu_second);
      const auto extra = [](const RunReport& r, const char* key) {
        auto it = r.extra.find(key);
        return it == r.extra.end() ? 0.0 : it->second;
      };
      runs.push_back({{"webdataset",
                       {{"images_per_second", s_rates.images_per_second},
                        {"images_per_cpu_second", s_rates.images_per_cpu_second},
                        {"samples", s.samples},
                        {"skipped_samples", s.skipped_samples},
                        {"bytes_uploaded", s.bytes_uploaded},
                        {"device", s.device}}},
                      {"image_folder",
                       {{"images_per_second", f_rates.images_per_second},
                        {"images_per_cpu_second", f_rates.images_per_cpu_second},
                        {"samples", f.samples},
                        {"skipped_samples", f.skipped_samples},
                        {"bytes_uploaded", f.bytes_uploaded},
                        {"device", f.device},
                        {"files", extra(f, "load.files")},
                        {"classes", extra(f, "load.classes")},
                        {"index_seconds", extra(f, "load.index_seconds")}}}});
    }
    std::printf(
        "  best images/s: webdataset %.0f, image_folder %.0f (ratio %.3f); per CPU second: "
        "webdataset %.0f, image_folder %.0f (ratio %.3f)\n",
        best_shards.images_per_second, best_folder.images_per_second,
        best_shards.images_per_second > 0
            ? best_folder.images_per_second / best_shards.images_per_second
            : 0.0,
        best_shards.images_per_cpu_second, best_folder.images_per_cpu_second,
        best_shards.images_per_cpu_second > 0
            ? best_folder.images_per_cpu_second / best_shards.images_per_cpu_second
            : 0.0);
    bench.result("image_folder_vs_webdataset", best_folder.images_per_second, "images/s",
                 best_shards.images_per_second, Target{0.95, true, false});
    bench.result("image_folder_vs_webdataset_cpu", best_folder.images_per_cpu_second,
                 "images/cpu-s", best_shards.images_per_cpu_second);
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
}

}  // namespace flowfeed::bench
