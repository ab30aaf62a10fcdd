// pipeline_bench's scenarios that run without a GPU, in --quick mode: the RESULT rows, the JSON
// file, the scaling plot; and the message of a scenario that needs a GPU. Nothing is timed.
#include <expat.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "flowfeed/nodes/builtin.hpp"
#include "process_util.hpp"
#include "tests/files.hpp"

namespace {

namespace fs = std::filesystem;
using flowfeed::test::run_shell;

struct BenchRun {
  int code;
  std::string output;  // stdout and stderr
  nlohmann::json json;
};

BenchRun run_bench(const std::string& args, const std::string& tag) {
  const fs::path json_path = flowfeed::test::fresh_path("pipeline_bench", tag + ".json");
  fs::remove(json_path);
  BenchRun r;
  r.code = run_shell(
      std::string(FLOWFEED_BENCH) + " " + args + " --json " + json_path.string() + " 2>&1",
      &r.output);
  std::ifstream in(json_path);
  if (in) r.json = nlohmann::json::parse(in);
  return r;
}

const nlohmann::json* find_row(const nlohmann::json& j, const std::string& name) {
  for (const auto& row : j.at("results")) {
    if (row.at("name") == name) return &row;
  }
  return nullptr;
}

void expect_row(const BenchRun& r, const std::string& name, const std::string& unit) {
  const nlohmann::json* row = find_row(r.json, name);
  ASSERT_NE(row, nullptr) << name << " missing from the JSON:\n" << r.json.dump(2);
  EXPECT_EQ(row->at("unit"), unit);
  EXPECT_GT(row->at("figure").get<double>(), 0);
  EXPECT_GT(row->at("baseline").get<double>(), 0);
  EXPECT_NEAR(row->at("ratio").get<double>(),
              row->at("figure").get<double>() / row->at("baseline").get<double>(), 1e-9);
  EXPECT_NE(r.output.find("RESULT " + name + " "), std::string::npos) << r.output;
}

/// expect_row for each {name, unit}, in order.
void expect_rows(const BenchRun& r, const std::vector<std::pair<std::string, std::string>>& rows) {
  for (const auto& [name, unit] : rows) {
    SCOPED_TRACE(name);
    expect_row(r, name, unit);
  }
}

bool gpu_visible() {
  flowfeed::Registry registry;
  flowfeed::register_builtin_nodes(registry);
  return registry.cuda_built() && registry.device_count() > 0;
}

TEST(PipelineBench, OverheadQuick) {
  const BenchRun r = run_bench("overhead --quick", "overhead");
  ASSERT_EQ(r.code, 0) << r.output;
  expect_row(r, "overhead", "us/batch");
  const nlohmann::json& target = find_row(r.json, "overhead")->at("target");
  EXPECT_EQ(target.at("value"), 5.0);
  EXPECT_EQ(target.at("of"), "figure");
  EXPECT_EQ(target.at("bound"), "at_most");
  EXPECT_EQ(r.json.at("scenarios").at("overhead").at("nodes"), 4);
}

TEST(PipelineBench, AnOutputPathIsCheckedBeforeAnyScenarioRuns) {
  std::string output;
  const std::string dir = fs::temp_directory_path().string();
  // Before, the scenario ran (its RESULT row printed) and the write failed at the end.
  EXPECT_EQ(
      run_shell(std::string(FLOWFEED_BENCH) + " overhead --quick --json " + dir + " 2>&1", &output),
      1);
  EXPECT_EQ(output, "pipeline_bench: cannot write results " + dir + " (it is a directory)\n");
  EXPECT_EQ(
      run_shell(std::string(FLOWFEED_BENCH) + " scaling --quick --svg /nonexistent-dir/s.svg 2>&1",
                &output),
      1);
  EXPECT_EQ(output,
            "pipeline_bench: cannot write scaling chart /nonexistent-dir/s.svg (directory "
            "/nonexistent-dir: No such file or directory)\n");
}

TEST(PipelineBench, StorageQuickMeasuresColdAndWarmReadsBesideTheirBaselines) {
  // Warm runs sweep two loader concurrencies; each row reports the better.
  const BenchRun r = run_bench("storage --quick --warm-loaders 2 3", "storage");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* io : {"pread", "io_uring"}) {
    SCOPED_TRACE(io);
    expect_row(r, std::string("storage_cold_") + io, "GB/s");
    expect_row(r, std::string("storage_warm_") + io, "GB/s");
    const nlohmann::json& cold = find_row(r.json, std::string("storage_cold_") + io)->at("target");
    EXPECT_EQ(cold.at("value"), 0.95);
    EXPECT_EQ(cold.at("of"), "ratio");
    const nlohmann::json& d = r.json.at("scenarios").at("storage");
    for (const char* kind : {"cold_", "warm_"}) {
      const nlohmann::json& run = d.at(std::string(kind) + io);
      // 48 MiB of 512 KiB rows in batches of 8: 12 batches, read straight into staging memory.
      EXPECT_EQ(run.at("batches"), 12);
      EXPECT_EQ(run.at("allocations_after_build"), 0);
      EXPECT_EQ(run.at("extra").at("stage.copied_bytes"), 0.0);
      EXPECT_EQ(run.at("extra").at("stage.passed_through_batches"), 12.0);
      EXPECT_EQ(run.at("extra").at("load.io_bytes"), 48.0 * (1 << 20));
    }
    for (const char* run : {"warm_", "warm_async_"}) {
      const std::string key = std::string(run).substr(0, 5) + io + (run[5] == 'a' ? "_async" : "");
      SCOPED_TRACE(key);
      const nlohmann::json& best = d.at(key);
      const int loaders = d.at(key + "_loaders");
      ASSERT_TRUE(loaders == 2 || loaders == 3) << loaders;
      EXPECT_EQ(best, d.at(key + "_loaders" + std::to_string(loaders)));
      EXPECT_GE(
          best.at("upload_gbps").get<double>(),
          d.at(key + "_loaders" + std::to_string(5 - loaders)).at("upload_gbps").get<double>());
      EXPECT_EQ(best.at("extra").at("stage.copied_bytes"), 0.0);
      EXPECT_EQ(best.at("extra").at("load.io_bytes"), 48.0 * (1 << 20));
    }
    // Cold runs read direct: every byte of 4 KiB-aligned rows behind a 4 KiB header.
    EXPECT_EQ(d.at(std::string("cold_") + io).at("extra").at("load.io_direct_bytes"),
              48.0 * (1 << 20));
  }
  expect_row(r, "storage_warm_io_uring_async", "GB/s");
  expect_row(r, "storage_warm_pread_async", "GB/s");
  expect_row(r, "storage_warm_mmap", "GB/s");
  expect_row(r, "storage_warm_mmap_async", "GB/s");
  // The data set of a quick run is removed afterwards.
  EXPECT_FALSE(fs::exists(r.json.at("scenarios").at("storage").at("features").get<std::string>()));
}

TEST(PipelineBench, SeedQuick) {
  const BenchRun r = run_bench("seed --quick", "seed");
  ASSERT_EQ(r.code, 0) << r.output;
  expect_row(r, "seed", "s");
  const nlohmann::json& d = r.json.at("scenarios").at("seed");
  EXPECT_EQ(d.at("batches"), 20);
  // 20 batches, load 20 ms, train 20 ms: 20 + 20 x 20 ms.
  EXPECT_NEAR(d.at("ideal_seconds").get<double>(), 0.42, 1e-9);
}

TEST(PipelineBench, TokensQuick) {
  const BenchRun r = run_bench("tokens --quick", "tokens");
  ASSERT_EQ(r.code, 0) << r.output;
  expect_rows(r, {{"tokens_random_windows", "windows/s"},
                  {"tokens_sequential_windows", "windows/s"},
                  {"tokens_random_windows_mmap", "windows/s"},
                  {"tokens_random_windows_io_uring", "windows/s"},
                  {"tokens_random_vs_target", "windows/s"}});
  EXPECT_EQ(find_row(r.json, "tokens_random_vs_target")->at("target").at("value"), 1e6);
  const nlohmann::json& d = r.json.at("scenarios").at("tokens");
  EXPECT_EQ(d.at("context"), 1024);
  // 8 MiB of uint16 tokens: 4,095 windows of 1,024 (+1) an epoch, 20,000 windows: 4 epochs.
  EXPECT_EQ(d.at("windows_per_epoch"), 4095);
  EXPECT_EQ(d.at("random").at("samples"), 4 * 4095);
  EXPECT_EQ(d.at("random").at("allocations_after_build"), 0);
  // Every run reads straight into the staging node's buffers: x and y, 4,096 bytes a window.
  for (const char* run : {"random", "sequential", "random_mmap", "random_io_uring"}) {
    SCOPED_TRACE(run);
    EXPECT_EQ(d.at(run).at("extra").at("stage.copied_bytes"), 0.0);
    EXPECT_EQ(d.at(run).at("extra").at("stage.passed_through_batches"), d.at(run).at("batches"));
  }
  EXPECT_EQ(d.at("random").at("extra").at("load.io_bytes"), 4.0 * 4095 * 4096);
}

TEST(PipelineBench, PackingQuick) {
  const BenchRun r = run_bench("packing --quick", "packing");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const std::string fit : {"best_fit", "first_fit"}) {
    SCOPED_TRACE(fit);
    expect_row(r, "packing_padding_" + fit, "fraction");
    expect_row(r, "packing_windows_" + fit, "windows/s");
  }
  const nlohmann::json* best = find_row(r.json, "packing_padding_best_fit");
  EXPECT_EQ(best->at("target").at("value"), 0.05);
  EXPECT_EQ(best->at("target").at("bound"), "at_most");
  // 20,000 documents of OpenWebText-like lengths in windows of 1,024: best-fit pads under 5%, and
  // no more than first-fit.
  const double best_padding = best->at("figure").get<double>();
  EXPECT_LT(best_padding, 0.05);
  EXPECT_LE(best_padding,
            find_row(r.json, "packing_padding_first_fit")->at("figure").get<double>());
  const nlohmann::json& d = r.json.at("scenarios").at("packing");
  EXPECT_EQ(d.at("documents"), 20000);
  for (const char* run : {"best_fit", "first_fit"}) {
    SCOPED_TRACE(run);
    const nlohmann::json& extra = d.at(run).at("extra");
    EXPECT_EQ(extra.at("load.packed_documents"), 20000.0);
    EXPECT_EQ(d.at(run).at("samples"), extra.at("load.packed_windows"));
    EXPECT_EQ(d.at(run).at("allocations_after_build"), 0);
    // Every window's tokens and padding: tokens + padding = windows x 1,024.
    EXPECT_NEAR(extra.at("load.padding_fraction").get<double>() *
                    extra.at("load.packed_windows").get<double>() * 1024,
                extra.at("load.packed_windows").get<double>() * 1024 - d.at("tokens").get<double>(),
                1e-3);
  }
}

/// Element names and attributes of an XML file, parsed with expat; false when it is not
/// well-formed.
struct Xml {
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> elements;
};

bool parse_xml(const std::string& text, Xml& xml) {
  XML_Parser parser = XML_ParserCreate(nullptr);
  XML_SetUserData(parser, &xml);
  XML_SetStartElementHandler(parser, [](void* data, const XML_Char* name, const XML_Char** atts) {
    auto& x = *static_cast<Xml*>(data);
    x.elements.push_back({name, {}});
    for (int i = 0; atts[i]; i += 2) x.elements.back().second.push_back({atts[i], atts[i + 1]});
  });
  const bool ok = XML_Parse(parser, text.data(), static_cast<int>(text.size()), 1) == XML_STATUS_OK;
  XML_ParserFree(parser);
  return ok;
}

TEST(PipelineBench, ScalingQuickWritesTheTableTheJsonAndTheSvg) {
  const fs::path svg = flowfeed::test::fresh_path("pipeline_bench", "scaling_test.svg");
  fs::remove(svg);
  const BenchRun r = run_bench("scaling --quick --svg " + svg.string(), "scaling");
  ASSERT_EQ(r.code, 0) << r.output;
  expect_row(r, "scaling_load_bound", "batches/s");
  expect_row(r, "scaling_train_bound", "batches/s");
  EXPECT_NE(r.output.find("| load_bound | 1 | 0.25 | prefetch_depth (load concurrency 2) | 32 |"),
            std::string::npos)
      << r.output;
  for (const char* config : {"load_bound", "train_bound"}) {
    const nlohmann::json& d = r.json.at("scenarios").at("scaling").at(config);
    EXPECT_EQ(d.at("depths"), nlohmann::json({1, 2, 4, 8, 16, 32}));
    EXPECT_EQ(d.at("concurrencies"), nlohmann::json({1, 2, 4, 8}));
    EXPECT_EQ(d.at("depth_batches_per_second").size(), 6u);
    EXPECT_EQ(d.at("concurrency_batches_per_second").size(), 4u);
  }

  std::ifstream in(svg);
  ASSERT_TRUE(in) << svg << " was not written";
  std::stringstream text;
  text << in.rdbuf();
  Xml xml;
  ASSERT_TRUE(parse_xml(text.str(), xml)) << "not well-formed XML:\n" << text.str();
  ASSERT_FALSE(xml.elements.empty());
  EXPECT_EQ(xml.elements.front().first, "svg");
  int polylines = 0;
  std::vector<std::string> knees;
  for (const auto& [name, atts] : xml.elements) {
    std::string cls, config, depth;
    for (const auto& [k, v] : atts) {
      if (k == "class") cls = v;
      if (k == "data-config") config = v;
      if (k == "data-depth") depth = v;
    }
    if (name == "polyline" && cls == "series") ++polylines;
    if (name == "circle" && cls == "knee") knees.push_back(config + "@" + depth);
  }
  EXPECT_EQ(polylines, 4);  // two configs x two sweeps
  ASSERT_EQ(knees.size(), 2u);
  for (const char* config : {"load_bound", "train_bound"}) {
    const std::string knee =
        r.json.at("scenarios").at("scaling").at(config).at("knee_depth").dump();
    EXPECT_NE(std::find(knees.begin(), knees.end(), std::string(config) + "@" + knee), knees.end())
        << config;
  }
  EXPECT_NE(text.str().find("knee: depth"), std::string::npos);
}

TEST(PipelineBench, AutotuneQuickComparesAutoWithTheSweepAndKeepsTheBudget) {
  const BenchRun r = run_bench("autotune --quick", "autotune");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* config : {"load_bound", "train_bound", "load_bound_small_budget"}) {
    expect_row(r, std::string("autotune_") + config, "batches/s");
    const nlohmann::json* share =
        find_row(r.json, std::string("autotune_") + config + "_settled_share");
    ASSERT_NE(share, nullptr) << config;
    EXPECT_EQ(share->at("unit"), "of the run's batches");
    const nlohmann::json& d = r.json.at("scenarios").at("autotune").at(config);
    EXPECT_EQ(d.at("within_budget"), true) << config;
    EXPECT_EQ(d.at("batches"), 80) << config;  // 2 epochs of 40
    EXPECT_LE(d.at("host_pool_bytes").get<double>(), d.at("host_budget_bytes").get<double>());
  }
  const nlohmann::json& small = r.json.at("scenarios").at("autotune").at("load_bound_small_budget");
  EXPECT_EQ(small.at("max_prefetch_depth"), 6);
  EXPECT_EQ(small.at("depth_capped_by_memory"), true);
  // Six batches in flight and the sampling order of 40 batches of 64 samples (8 bytes each).
  EXPECT_EQ(small.at("host_budget_bytes"), 6 * 3 * 16640 + 40 * 64 * 8);
  EXPECT_NE(r.output.find("| load_bound | load concurrency 2 | prefetch_depth 32 |"),
            std::string::npos)
      << r.output;
}

TEST(PipelineBench, CudaScenarioWithoutAGpuSaysSoAndExitsThree) {
  if (gpu_visible()) GTEST_SKIP() << "a GPU is visible: the naive scenario runs";
  flowfeed::Registry registry;
  flowfeed::register_builtin_nodes(registry);
  const std::string why = registry.cuda_built()
                              ? "naive needs a CUDA device (none is visible: run it on a GPU "
                                "machine)"
                              : "naive needs CUDA (this build has none: reconfigure with "
                                "-DFLOWFEED_CUDA=ON and run it on a GPU machine)";
  const BenchRun r = run_bench("naive", "naive");
  EXPECT_EQ(r.code, 3);
  EXPECT_EQ(r.output, "pipeline_bench: " + why + "\n");
  // The JSON is still written, with no rows.
  EXPECT_TRUE(r.json.at("results").empty());
}

}  // namespace

namespace {

#if FLOWFEED_TEST_IMAGES  // the image family
// JPEG shards from scripts/make_image_shards.py through configs/images.yaml (on the host types
// here): a row per thread count against the one-thread decode rate times the threads, and the
// bytes that were uploaded are the uint8 images, not the floats normalize makes of them.
/// Writes 8 JPEGs in 2 shards (5 + 3) with scripts/make_image_shards.py into a new `dir`.
void make_shards(const fs::path& dir) {
  fs::remove_all(dir);
  std::string made;
  const char* python = std::getenv("FLOWFEED_PYTHON");
  ASSERT_EQ(run_shell(std::string(python && *python ? python : FLOWFEED_PYTHON) + " " +
                          FLOWFEED_SOURCE_DIR +
                          "/scripts/make_image_shards.py --count 8 --per-shard 5 "
                          "--min-side 120 --max-side 160 --out " +
                          dir.string() + " 2>&1",
                      &made),
            0)
      << made;
}

TEST(PipelineBench, ImagesQuickRunsTheImagesConfigPerThreadCount) {
  const fs::path dir = flowfeed::test::fresh_path("pipeline_bench", "images");
  ASSERT_NO_FATAL_FAILURE(make_shards(dir));
  const BenchRun r =
      run_bench("images --quick --threads 1 2 --shards '" + dir.string() + "/*.tar'", "images");
  ASSERT_EQ(r.code, 0) << r.output;
  expect_row(r, "images.threads_1", "images/s");
  expect_row(r, "images.threads_2", "images/s");
  const nlohmann::json& d = r.json.at("scenarios").at("images");
  EXPECT_EQ(d.at("samples"), 8);
  EXPECT_EQ(d.at("shards"), 2);
  EXPECT_EQ(d.at("decode").at("images"), 8);
  const double one = d.at("decode").at("images_per_second").get<double>();
  ASSERT_EQ(d.at("runs").size(), 2u);
  for (const auto& run : d.at("runs")) {
    EXPECT_EQ(run.at("samples"), 8);
    EXPECT_EQ(run.at("allocations_after_build"), 0);
    // Two batches of 4: x uint8 [224, 224, 3], then y int32 at the next 256-byte boundary.
    EXPECT_EQ(run.at("bytes_uploaded"), 2 * (4 * 224 * 224 * 3 + 4 * 4));
    EXPECT_DOUBLE_EQ(run.at("decode_ceiling").get<double>(), one * run.at("threads").get<int>());
  }
  fs::remove_all(dir);
}

// The shards' JPEGs written as a class tree (one directory per label), then configs/images.yaml
// with webdataset over the shards and image_folder over the tree: the same 8 images each way,
// the same bytes uploaded. The tree goes afterwards; with --keep it stays and the next run reads
// it again instead of writing it.
TEST(PipelineBench, ImageFolderQuickReadsTheSameImagesAsTheShardsFromATreeWrittenOnce) {
  const fs::path dir = flowfeed::test::fresh_path("pipeline_bench", "image_folder");
  ASSERT_NO_FATAL_FAILURE(make_shards(dir / "shards"));
  const fs::path tree = dir / "tree";
  const std::string args = "image_folder --quick --shards '" + (dir / "shards").string() +
                           "/*.tar' --dir " + tree.string();
  for (const bool keep : {true, true, false}) {
    SCOPED_TRACE(keep);
    const bool reused = fs::exists(tree);
    const BenchRun r = run_bench(args + (keep ? " --keep" : ""), "image_folder");
    ASSERT_EQ(r.code, 0) << r.output;
    expect_row(r, "image_folder_vs_webdataset", "images/s");
    expect_row(r, "image_folder_vs_webdataset_cpu", "images/cpu-s");
    const nlohmann::json& d = r.json.at("scenarios").at("image_folder");
    EXPECT_EQ(d.at("samples"), 8);
    EXPECT_EQ(d.at("tree").at("images"), 8);
    EXPECT_EQ(d.at("tree").at("written"), !reused);
    std::size_t files = 0;
    std::set<std::string> classes;
    if (fs::exists(tree)) {
      for (const auto& e : fs::recursive_directory_iterator(tree)) {
        if (e.path().extension() == ".jpg") {
          ++files;
          classes.insert(e.path().parent_path().filename().string());
        }
      }
    }
    EXPECT_EQ(files, keep ? 8u : 0u);
    EXPECT_EQ(fs::exists(tree), keep);
    if (keep) {
      EXPECT_EQ(d.at("tree").at("classes"), classes.size());
    }
    ASSERT_EQ(d.at("runs").size(), 1u);
    const nlohmann::json& run = d.at("runs").at(0);
    for (const char* loader : {"webdataset", "image_folder"}) {
      SCOPED_TRACE(loader);
      EXPECT_EQ(run.at(loader).at("samples"), 8);
      EXPECT_EQ(run.at(loader).at("skipped_samples"), 0);
      // Two batches of 4: x uint8 [224, 224, 3], then y int32 at the next 256-byte boundary.
      EXPECT_EQ(run.at(loader).at("bytes_uploaded"), 2 * (4 * 224 * 224 * 3 + 4 * 4));
    }
    EXPECT_EQ(run.at("image_folder").at("files"), 8);
  }
  fs::remove_all(dir);
}

// A --dir that holds anything but a tree the scenario wrote from the same shards is refused, and
// left as it was.
TEST(PipelineBench, ImageFolderRefusesADirectoryItDidNotWriteFromTheseShards) {
  const fs::path dir = flowfeed::test::fresh_path("pipeline_bench", "image_folder_refused");
  ASSERT_NO_FATAL_FAILURE(make_shards(dir / "shards"));
  const fs::path tree = dir / "mine";
  fs::create_directories(tree);
  std::ofstream(tree / "notes.txt") << "mine\n";
  // image_folder over both shards into `into` fails (exit 1) with `error` after the dir's name.
  const auto expect_refused = [&](const fs::path& into, const std::string& tag,
                                  const std::string& error) {
    const BenchRun r = run_bench("image_folder --quick --shards '" + (dir / "shards").string() +
                                     "/*.tar' --dir " + into.string(),
                                 tag);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("pipeline_bench: image_folder: " + into.string() + error),
              std::string::npos)
        << r.output;
  };
  expect_refused(tree, "image_folder_refused",
                 " exists and is not a tree this scenario wrote (it has no "
                 ".flowfeed_image_folder_bench) give a new or empty --dir\n");
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(tree)) left.push_back(e.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"notes.txt"});
  std::ifstream in(tree / "notes.txt");
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "mine");
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find(".partial"), std::string::npos) << e.path();
  }
  // A tree it wrote from other shards (the first of the two only) is refused too, and kept.
  const fs::path kept = dir / "kept";
  const BenchRun first =
      run_bench("image_folder --quick --keep --shards " +
                    (dir / "shards" / "images-00000.tar").string() + " --dir " + kept.string(),
                "image_folder_first");
  ASSERT_EQ(first.code, 0) << first.output;
  expect_refused(kept, "image_folder_other",
                 " holds a tree written from other shards (see its "
                 ".flowfeed_image_folder_bench) remove it, or give another --dir\n");
  std::size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(kept)) files += e.is_regular_file();
  EXPECT_EQ(files, 5u + 1u);  // the first shard's 5 images and the manifest
  fs::remove_all(dir);
}
#endif

TEST(PipelineBench, AllWithoutAGpuRunsTheHostScenariosAndSaysWhatItSkipped) {
  if (gpu_visible()) GTEST_SKIP() << "a GPU is visible: `all` runs every scenario";
  const fs::path svg = flowfeed::test::fresh_path("pipeline_bench", "all_test.svg");
  const BenchRun r = run_bench("all --quick --svg " + svg.string(), "all");
  ASSERT_EQ(r.code, 0) << r.output;
  expect_rows(r, {{"overhead", "us/batch"},
                  {"seed", "s"},
                  {"scaling_load_bound", "batches/s"},
                  {"scaling_train_bound", "batches/s"},
                  {"storage_warm_io_uring", "GB/s"},
                  {"tokens_random_windows", "windows/s"},
                  {"packing_padding_best_fit", "fraction"}});
  EXPECT_TRUE(fs::exists(svg));
  std::vector<std::string> skipped;
  for (const auto& s : r.json.at("skipped")) {
    skipped.push_back(s.at("scenario"));
    EXPECT_NE(r.output.find("SKIPPED " + s.at("scenario").get<std::string>() + ": " +
                            s.at("reason").get<std::string>()),
              std::string::npos)
        << r.output;
  }
  EXPECT_EQ(skipped, (std::vector<std::string>{"naive", "small_batches", "bandwidth",
                                               "resident_vs_streamed", "images", "image_folder"}));
}

}  // namespace
