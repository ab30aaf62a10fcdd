// The image_folder loader on trees written by tests/nodes/make_image_folder.py (PIL images, the
// order and labels from torchvision's own class discovery and walk): every image once per epoch
// with its label, nested classes, ignored files, empty classes, file lists, ranks, and files that
// are bad, vanish or turn into FIFOs after the index was built.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "tests/apps/process_util.hpp"
#include "tests/nodes/webdataset_fixture.hpp"

namespace flowfeed {
namespace {

using namespace webdataset_testing;

/// A tree written by the helper script; fresh per object (tests that damage it own one).
class Tree {
 public:
  Tree() {
    const std::string cmd = fmt::format("{} {}/tests/nodes/make_image_folder.py {}",
                                        FLOWFEED_PYTHON, FLOWFEED_SOURCE_DIR, dir_.file(""));
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
    std::ifstream in(dir_.file("manifest.json"));
    manifest_ = Json::parse(in);
  }
  std::string file(const std::string& name) const { return dir_.file(name); }
  const Json& manifest() const { return manifest_; }
  const Json& files() const { return manifest_["files"]; }

 private:
  TempDir dir_;
  Json manifest_;
};

const std::string kFolder = "node 'load' (image_folder, <string>:4): ";

const Tree& shared_tree() {
  static const Tree t;
  return t;
}

std::string folder(const std::string& params, const std::string& pipeline = "",
                   const std::string& sampler = "shuffle: false") {
  return fmt::format(
      "pipeline: {{ device: host{} }}\n"
      "sampler: {{ {} }}\n"
      "nodes:\n"
      "  - name: load\n"
      "    type: image_folder\n"
      "    params: {{ height: 16, width: 16, crop: center, resize: 16{} }}\n"
      "  - {{ name: train, type: capture }}\n",
      pipeline, sampler, params);
}

/// Every delivered sample: (epoch, sample) → (label, first pixel).
struct Seen {
  std::map<std::pair<int, std::uint32_t>, std::pair<int, std::array<int, 3>>> rows;
  std::size_t count = 0;
};

Seen seen_of(const Outcome& r, int epochs) {
  Seen s;
  const std::size_t batches = r.seen->samples.size();
  for (std::size_t b = 0; b < batches; ++b) {
    const int epoch = static_cast<int>(b * static_cast<std::size_t>(epochs) / batches);
    const auto* px = reinterpret_cast<const std::uint8_t*>(r.seen->x[b].data());
    for (std::size_t i = 0; i < r.seen->samples[b].size(); ++i) {
      const std::uint8_t* p = px + i * 16 * 16 * 3 + (8 * 16 + 8) * 3;  // the centre pixel
      s.rows[{epoch, r.seen->samples[b][i]}] = {r.seen->y[b][i], {p[0], p[1], p[2]}};
      ++s.count;
    }
  }
  return s;
}

/// The sample is file `expected` of the manifest: its label and (within JPEG's error) colour.
void expect_file(const std::pair<int, std::array<int, 3>>& got, const Json& expected, int label) {
  EXPECT_EQ(got.first, label) << expected["path"];
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(got.second[c], expected["rgb"][c].get<int>(), 3) << expected["path"];
  }
}

TEST(ImageFolder, EveryImageOncePerEpochWithItsTorchvisionLabel) {
  const Tree& t = shared_tree();
  const Json& files = t.files();
  ASSERT_EQ(files.size(), 10u);  // nested, any-case extensions; no text, gif, FIFO or root file
  Outcome r = run(folder(", root: '" + t.file("tree") + "'", ", epochs: 2, batch_size: 3",
                         "shuffle: true, seed: 5"),
                  2);
  const Seen s = seen_of(r, 2);
  EXPECT_EQ(s.count, 20u);
  ASSERT_EQ(s.rows.size(), 20u) << "each image once per epoch";
  for (const auto& [key, row] : s.rows) {
    ASSERT_LT(key.second, files.size());
    expect_file(row, files[key.second], files[key.second]["label"].get<int>());
  }
  // The class mapping is torchvision's, the empty class keeping its index.
  const auto& extra = r.report.extra;
  const Json& classes = t.manifest()["classes"];
  ASSERT_EQ(classes, Json({"Bird", "cat", "dog", "empty", "zebra"}));
  EXPECT_EQ(extra.at("load.classes"), 5.0);
  for (std::size_t c = 0; c < classes.size(); ++c) {
    EXPECT_EQ(extra.at("load.class." + classes[c].get<std::string>()), static_cast<double>(c));
  }
  EXPECT_EQ(extra.at("load.files"), 10.0);
  EXPECT_EQ(extra.at("load.special_files_ignored"), 1.0);  // dog/pipe.jpg, never opened
  EXPECT_GT(extra.at("load.index_bytes"), 10.0 * 16);
  EXPECT_EQ(files[5]["path"], "cat/sub-x/d.png") << "sorted(os.walk()) order: sub-x before sub/";
}

TEST(ImageFolder, RankShardsAreDisjointAndCoverTheTree) {
  const Tree& t = shared_tree();
  const std::string root = ", root: '" + t.file("tree") + "'";
  std::set<std::uint32_t> all;
  std::size_t total = 0;
  for (int rank = 0; rank < 3; ++rank) {
    Outcome part = run(folder(root, ", batch_size: 2",
                              fmt::format("shuffle: true, seed: 2, rank: {}, world: 3", rank)));
    const Seen s = seen_of(part, 1);
    for (const auto& [key, row] : s.rows) {
      EXPECT_TRUE(all.insert(key.second).second) << "sample " << key.second << " on two ranks";
      expect_file(row, t.files()[key.second], t.files()[key.second]["label"].get<int>());
    }
    total += s.count;
  }
  EXPECT_EQ(total, t.files().size());
  EXPECT_EQ(all.size(), t.files().size());
}

TEST(ImageFolder, FileListGivesItsOwnLabelsAndPaths) {
  const Tree& t = shared_tree();
  Outcome r = run(folder(", file_list: '" + t.file("list.csv") + "'", ", batch_size: 4"));
  const Seen s = seen_of(r, 1);
  ASSERT_EQ(s.rows.size(), t.files().size());
  for (const auto& [key, row] : s.rows) {
    expect_file(row, t.files()[key.second], 100 + static_cast<int>(key.second));
  }
  EXPECT_EQ(r.report.extra.count("load.classes"), 0u);
  // With root, relative paths start there; an absolute path stays as it is.
  TempDir d;
  std::ofstream(d.file("l.txt")) << "zebra/y.png 4\n" << t.file("tree/cat/a.jpg") << "\t5\n";
  Outcome rooted = run(folder(
      ", root: '" + t.file("tree") + "', file_list: '" + d.file("l.txt") + "'", ", batch_size: 2"));
  const Seen two = seen_of(rooted, 1);
  ASSERT_EQ(two.rows.size(), 2u);
  expect_file(two.rows.at({0, 0u}), t.files()[9], 4);
  expect_file(two.rows.at({0, 1u}), t.files()[2], 5);
}

TEST(ImageFolder, FileListRowsWithoutALabelAreNamedByLine) {
  TempDir d;
  {
    std::ofstream f(d.file("l.csv"));
    f << "path,label\na.jpg,1\nb.jpg,x\n";
  }
  EXPECT_EQ(build_error(folder(", file_list: '" + d.file("l.csv") + "'")),
            kFolder + d.file("l.csv") + ":3: label 'x' is not an integer");
  {
    std::ofstream f(d.file("l.csv"));
    f << "a.jpg 1\nb.jpg 9\n";
  }
  EXPECT_EQ(build_error(folder(", num_classes: 5, file_list: '" + d.file("l.csv") + "'")),
            kFolder + d.file("l.csv") + ":2: label 9 is out of range [0, 5)");
}

TEST(ImageFolder, RootErrorsSayWhatIsMissing) {
  TempDir d;
  EXPECT_EQ(build_error(folder(", root: '" + d.file("none") + "'")),
            kFolder + "root '" + d.file("none") + "' cannot be listed: No such file or directory");
  EXPECT_EQ(
      build_error(folder(", root: '" + d.file("") + "'")),
      kFolder + "root '" + d.file("") + "' holds no class directory (images go in root/<class>/)");
  std::filesystem::create_directories(d.file("cls/sub"));
  std::ofstream(d.file("cls/sub/a.txt")) << "text";
  EXPECT_EQ(build_error(folder(", root: '" + d.file("") + "'")),
            kFolder + "root '" + d.file("") +
                "' holds no image (.jpg, .jpeg or .png below a class directory)");
  const std::string tree = shared_tree().file("tree");
  EXPECT_EQ(build_error(folder(", num_classes: 4, root: '" + tree + "'")),
            kFolder + "root '" + tree + "' has 5 class directories, more than num_classes = 4");
  Registry r;
  register_builtin_nodes(r);
  register_capture(r, std::make_shared<Captured>());
  const std::string message =
      error_of<ConfigError>([&] { Pipeline p(load_config_string(folder(""), r), r); });
  EXPECT_NE(message.find("nodes.load.params: give root (a class tree root/<class>/<file>) or "
                         "file_list (rows path,label)"),
            std::string::npos)
      << message;
}

/// pipeline_runner's exit code and what it printed (stderr with stdout), under a time limit.
std::pair<int, std::string> runner(const std::string& args) {
  std::string out;
  const int code = test::run_shell_bounded(std::string(FLOWFEED_RUNNER) + " " + args, &out);
  return {code, out};
}

// The runner lists a loader's classes as the loader labels them: torchvision's find_classes.
TEST(ImageFolder, TheRunnerListsTheClassMappingOfEveryLoaderWithoutARun) {
  const Tree& t = shared_tree();
  TempDir d;
  const std::string tree = t.file("tree");
  const std::string config = d.file("c.yaml");
  std::ofstream(config) << "pipeline: { device: host, batch_size: 2 }\nnodes:\n"
                        << "  - { name: load, type: image_folder, params: { root: '" << tree
                        << "', height: 16, width: 16 } }\n  - { name: train, type: discard }\n";
  std::string want = "node 'load': " + std::to_string(t.manifest()["classes"].size()) +
                     " classes, " + std::to_string(t.files().size()) + " images under " + tree +
                     "\n";
  for (std::size_t c = 0; c < t.manifest()["classes"].size(); ++c) {
    want += std::to_string(c) + "\t" + t.manifest()["classes"][c].get<std::string>() + "\n";
  }
  EXPECT_EQ(runner(config + " --list-classes"), std::make_pair(0, want));
  EXPECT_EQ(runner(config + " --list-classes --set nodes.load.params.root=" + d.file("none")),
            std::make_pair(1, "error: node 'load' (image_folder): root '" + d.file("none") +
                                  "' cannot be listed: No such file or directory\n"));
  EXPECT_EQ(runner(std::string(FLOWFEED_SOURCE_DIR) + "/configs/mnist_like.yaml --list-classes"),
            std::make_pair(2, std::string("pipeline_runner: --list-classes: the config has no "
                                          "image_folder loader\n")));
}

TEST(ImageFolder, LinkedClassesCountAndALinkLoopIsWalkedOnce) {
  const Tree& t = shared_tree();
  TempDir d;
  std::filesystem::create_directories(d.file("cls"));
  std::filesystem::copy_file(t.file("tree/zebra/y.png"), d.file("cls/a.png"));
  std::filesystem::create_directory_symlink(".", d.file("cls/loop"));  // cls/loop/loop/...
  std::filesystem::create_directory_symlink("cls", d.file("alias"));   // a class as torchvision's
  Outcome r = run(folder(", root: '" + d.file("") + "'", ", batch_size: 4"));
  const Seen s = seen_of(r, 1);
  ASSERT_EQ(s.rows.size(), 2u);
  const Json& y = t.files()[9];
  ASSERT_EQ(y["path"], "zebra/y.png");
  expect_file(s.rows.at({0, 0u}), y, 0);  // alias/a.png
  expect_file(s.rows.at({0, 1u}), y, 1);  // cls/a.png
  EXPECT_EQ(r.report.extra.at("load.class.alias"), 0.0);
  EXPECT_EQ(r.report.extra.at("load.class.cls"), 1.0);
}

TEST(ImageFolder, CorruptImageIsSkippedOrNamed) {
  const Tree& t = shared_tree();
  const std::string root = ", root: '" + t.file("corrupt") + "'";
  // a/1.png a/2.jpg a/bad.jpg b/3.png b/4.jpg b/5.png: sample 2 is the damaged one.
  Outcome r = run(folder(root, ", batch_size: 3, on_error: skip, max_skipped: 1"));
  EXPECT_EQ(r.report.samples, 5u);
  EXPECT_EQ(r.report.skipped_samples, 1u);
  const Seen s = seen_of(r, 1);
  EXPECT_EQ(s.rows.count({0, 2u}), 0u);
  EXPECT_EQ(s.rows.size(), 5u);
  const std::string message = run_error(folder(root, ", batch_size: 3"));
  const std::string bad = t.file("corrupt") + "/a/bad.jpg: ";
  EXPECT_NE(message.find(bad), std::string::npos) << message;
}

// Files listed by the walk that cannot be read: a link to nothing (torchvision lists it too) and,
// where the tests do not run as root, a file without read permission. Each is a bad sample.
TEST(ImageFolder, UnreadableFilesAreBadSamplesNamedByPath) {
  const Tree& t = shared_tree();
  TempDir d;
  std::filesystem::create_directories(d.file("cls"));
  std::filesystem::copy_file(t.file("tree/zebra/y.png"), d.file("cls/a.png"));
  std::filesystem::create_symlink(d.file("nowhere.jpg"), d.file("cls/b.jpg"));
  std::filesystem::copy_file(t.file("tree/zebra/y.png"), d.file("cls/c.png"));
  const bool root_user = ::geteuid() == 0;  // root reads a file of mode 000 all the same
  if (!root_user) {
    ASSERT_EQ(::chmod(d.file("cls/c.png").c_str(), 0), 0);
  }
  const std::string root = ", root: '" + d.file("") + "'";
  Outcome r = run(folder(root, ", batch_size: 3, on_error: skip, max_skipped: 2"));
  const std::size_t bad = root_user ? 1 : 2;
  EXPECT_EQ(r.report.samples, 3u - bad);
  EXPECT_EQ(r.report.skipped_samples, bad);
  std::string warnings;
  for (const std::string& w : r.report.warnings) warnings += w + "\n";
  EXPECT_NE(warnings.find(d.file("cls/b.jpg") + ": cannot open: No such file or directory"),
            std::string::npos)
      << warnings;
  if (!root_user) {
    EXPECT_NE(warnings.find(d.file("cls/c.png") + ": cannot open: Permission denied"),
              std::string::npos)
        << warnings;
  }
  const std::string message = run_error(folder(root, ", batch_size: 3"));
  EXPECT_NE(message.find(d.file("cls/b.jpg") + ": cannot open: No such file or directory"),
            std::string::npos)
      << message;
}

TEST(ImageFolder, FilesThatVanishOrBecomeFifosAfterTheWalkAreBadSamples) {
  const Tree t;  // damaged below: its own
  const std::string root = t.file("tree");
  Registry reg;
  register_builtin_nodes(reg);
  register_capture(reg, std::make_shared<Captured>());
  const auto build = [&](const std::string& pipeline) {
    return std::make_unique<Pipeline>(
        load_config_string(folder(", root: '" + root + "'", pipeline), reg), reg);
  };
  auto skipping = build(", batch_size: 4, on_error: skip, max_skipped: 3");
  auto failing = build(", batch_size: 4");
  const std::string gone = root + "/" + t.files()[2]["path"].get<std::string>();
  const std::string fifo = root + "/" + t.files()[7]["path"].get<std::string>();
  ASSERT_EQ(std::remove(gone.c_str()), 0);
  ASSERT_EQ(std::remove(fifo.c_str()), 0);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const std::string cut = root + "/" + t.files()[4]["path"].get<std::string>();
  std::filesystem::resize_file(cut, 40);  // changed after the walk: cut short
  const RunReport report = skipping->run();
  EXPECT_EQ(report.samples, 7u);
  EXPECT_EQ(report.skipped_samples, 3u);
  std::string warnings;
  for (const std::string& w : report.warnings) warnings += w + "\n";
  EXPECT_NE(warnings.find(gone + ": cannot open: No such file or directory"), std::string::npos)
      << warnings;
  EXPECT_NE(
      warnings.find(fifo + ": is not a regular file (a FIFO, socket, device or directory); not "
                           "read"),
      std::string::npos)
      << warnings;
  const std::string message = error_of<NodeError>([&] { failing->run(); });
  EXPECT_NE(message.find(gone + ": cannot open: No such file or directory"), std::string::npos)
      << message;
}

}  // namespace
}  // namespace flowfeed
