// Exact resume inside one process: the global cursor's math, the checkpoint files, and pull mode's
// cursor over what the caller released.
#include "flowfeed/checkpoint.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "flowfeed/builder.hpp"
#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/sampler.hpp"
#include "tests/error_of.hpp"
#include "tests/files.hpp"

namespace flowfeed {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  return test::fresh_path("ckpt", name);
}

/// The samples of global step `step`: every rank's batch `step`, together.
std::multiset<std::uint32_t> global_step(std::size_t n, std::size_t batch, int world,
                                         std::uint32_t epoch, std::size_t step) {
  std::multiset<std::uint32_t> out;
  for (int rank = 0; rank < world; ++rank) {
    Sampler s(SamplerOptions{true, 9, false, rank, world}, n, batch);
    if (step >= s.batches_per_epoch()) continue;
    std::vector<std::uint32_t> b;
    s.batch_samples(s.epoch_order(epoch), step, b);
    out.insert(b.begin(), b.end());
  }
  return out;
}

TEST(GlobalCursor, StepKOfEveryRankTakesTheKthGlobalBatchOfTheEpochOrder) {
  // The property resume across world sizes rests on: with the global batch world x batch fixed,
  // global step k is the same set of samples for every world size.
  for (std::size_t n : {1000u, 1001u, 97u}) {
    const std::vector<std::uint32_t> order =
        Sampler(SamplerOptions{true, 9, false, 0, 1}, n, 12).epoch_order(3);
    for (std::size_t step = 0; step * 12 < n; ++step) {
      const auto first = order.begin() + static_cast<std::ptrdiff_t>(step * 12);
      const std::multiset<std::uint32_t> expected(
          first, order.begin() + static_cast<std::ptrdiff_t>(std::min(n, step * 12 + 12)));
      EXPECT_EQ(global_step(n, 6, 2, 3, step), expected) << "n=" << n << " step " << step;
      EXPECT_EQ(global_step(n, 4, 3, 3, step), expected) << "n=" << n << " step " << step;
      EXPECT_EQ(global_step(n, 3, 4, 3, step), expected) << "n=" << n << " step " << step;
    }
  }
}

TEST(GlobalCursor, ACheckpointAtStepKResumesEveryRankOfAnyWorldAtItsBatchK) {
  Sampler two(SamplerOptions{true, 9, false, 1, 2}, 1000, 6);  // rank 1 of 2, 84 batches
  const Checkpoint c = make_checkpoint(two, 84 + 30, {}, 114);
  EXPECT_EQ(c.epoch, 1u);
  EXPECT_EQ(c.samples, 30u * 12);
  EXPECT_EQ(c.global_batch, 12u);
  // The same world: the next batch of the rank. World 1 (batch 12) and 3 (batch 4): step 30.
  EXPECT_EQ(resume_point(c, two, 2, "ck").first, 84u + 30);
  Sampler one(SamplerOptions{true, 9, false, 0, 1}, 1000, 12);
  EXPECT_EQ(resume_point(c, one, 2, "ck").first, 84u + 30);
  Sampler three(SamplerOptions{true, 9, false, 2, 3}, 1000, 4);
  EXPECT_EQ(resume_point(c, three, 2, "ck").first, 84u + 30);
  // Past a rank's last batch of the epoch: the next epoch.
  Sampler short_rank(SamplerOptions{true, 9, false, 1, 2}, 15, 7);  // 1 batch; rank 0 has 2
  Checkpoint last = make_checkpoint(Sampler(SamplerOptions{true, 9, false, 0, 2}, 15, 7), 1, {}, 1);
  EXPECT_EQ(last.samples, 14u);
  EXPECT_EQ(resume_point(last, short_rank, 2, "ck").first, 1u);
}

TEST(GlobalCursor, ADifferentGlobalBatchIsRejectedNamingBothSizes) {
  Sampler two(SamplerOptions{true, 9, false, 0, 2}, 1000, 6);
  const Checkpoint c = make_checkpoint(two, 5, {}, 5);
  Sampler one(SamplerOptions{true, 9, false, 0, 1}, 1000, 6);
  EXPECT_EQ(test::error_of<ConfigError>([&] { resume_point(c, one, 2, "ck/pipeline.json"); }),
            "ck/pipeline.json: cursor.global_batch: the checkpoint was written by world 2 x "
            "batch_size 6 = global batch 12, this run is world 1 x batch_size 6 = 6 (a resume "
            "keeps the global batch, so that every global step trains on the same samples) set "
            "pipeline.batch_size: 12");
  Sampler five(SamplerOptions{true, 9, false, 0, 5}, 1000, 2);
  EXPECT_THROW(
      {
        try {
          resume_point(c, five, 2, "ck");
        } catch (const ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("use a world size that divides 12"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      ConfigError);
}

TEST(GlobalCursor, OtherDataSeedShuffleOrDropLastAreRejectedNamingTheField) {
  Sampler s(SamplerOptions{true, 9, false, 0, 1}, 1000, 10);
  const Checkpoint c = make_checkpoint(s, 3, {}, 3);
  auto message = [&](const SamplerOptions& o, std::size_t n) {
    try {
      resume_point(c, Sampler(o, n, 10), 2, "ck");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message({true, 9, false, 0, 1}, 999),
            "ck: sampler.dataset_size: the checkpoint was written for 1000 samples, this run's "
            "data set has 999 (a resume continues the same sample order) resume with the same "
            "data set");
  EXPECT_EQ(message({true, 8, false, 0, 1}, 1000),
            "ck: sampler.seed: the checkpoint was written with seed 9, this run has seed 8 (every "
            "epoch's order comes from the seed) set sampler.seed: 9");
  EXPECT_EQ(message({false, 9, false, 0, 1}, 1000),
            "ck: sampler.shuffle: the checkpoint was written with shuffle: true, this run has "
            "shuffle: false (a resume continues the same sample order) set sampler.shuffle: true");
  EXPECT_EQ(message({true, 9, true, 0, 1}, 1000),
            "ck: sampler.drop_last: the checkpoint was written with drop_last: false, this run "
            "has drop_last: true (it decides which batches an epoch has) set sampler.drop_last: "
            "false");
}

TEST(CheckpointFiles, RoundTripAndOlderGenerationsAreRemoved) {
  const fs::path dir = temp_dir("roundtrip");
  Sampler s(SamplerOptions{true, 9, true, 0, 1}, 1000, 10);
  write_checkpoint(dir, make_checkpoint(s, 7, {}, 7), {{"train", {"mlp", "first"}}});
  Checkpoint w = make_checkpoint(s, 12, {14, 15}, 20);
  write_checkpoint(dir, w, {{"train", {"mlp", std::string("sec\0nd", 6)}}});
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"flowfeed-files.json", "flowfeed.lock", "pipeline.json",
                                          "train.2.bin"}));
  const Checkpoint r = read_checkpoint(dir);
  EXPECT_EQ(r.epoch, 0u);
  EXPECT_EQ(r.samples, 120u);
  EXPECT_EQ(r.finished_ahead, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(r.steps, 20u);
  EXPECT_TRUE(r.shuffle && r.drop_last);
  EXPECT_EQ(r.seed, 9u);
  EXPECT_EQ(read_node_state(r, "train"), std::string("sec\0nd", 6));
  EXPECT_EQ(resume_point(r, s, 2, "ck").skip, (std::vector<std::uint64_t>{14, 15}));
  // The manifest alone names the same checkpoint.
  EXPECT_EQ(read_checkpoint((dir / "pipeline.json").string()).samples, 120u);
}

/// read_checkpoint's message for a manifest edited by `edit` (text -> text).
std::string read_error(const std::string& name, const std::function<std::string(std::string)>& edit,
                       fs::path* dir_out = nullptr) {
  const fs::path dir = temp_dir(name);
  Sampler s(SamplerOptions{true, 9, false, 0, 1}, 1000, 10);
  write_checkpoint(dir, make_checkpoint(s, 3, {}, 3), {{"train", {"mlp", "weights"}}});
  const fs::path manifest = dir / "pipeline.json";
  const std::string text = edit(test::read_file(manifest));
  std::ofstream(manifest, std::ios::trunc) << text;
  if (dir_out) *dir_out = dir;
  try {
    read_checkpoint(dir);
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    // Relative to the directory, so that the expectations do not hold the temp path.
    const std::string prefix = manifest.string();
    return m.rfind(prefix, 0) == 0 ? "M" + m.substr(prefix.size()) : m;
  }
  return "accepted";
}

TEST(CheckpointFiles, CorruptTruncatedAndFutureFilesNameTheField) {
  EXPECT_EQ(read_error("truncated", [](std::string t) { return t.substr(0, 60); }),
            "M:4:8: not a checkpoint: syntax error while parsing object key - invalid string: "
            "missing closing quote; last read: '\"samp'; expected string literal (the file is "
            "truncated or corrupt) resume from a complete checkpoint");
  // A field edited to another value or type, and what reading the manifest says.
  for (const test::EditCase& e : std::initializer_list<test::EditCase>{
           {"future", "\"version\": 1", "\"version\": 3",
            "M: version: 3 is newer than this build reads (version 2; written by a newer "
            "flowfeed) resume with the flowfeed that wrote it"},
           {"type", "\"samples\": 30", "\"samples\": \"30\"",
            "M: cursor.samples: expected a non-negative integer, found \"30\" (the checkpoint is "
            "corrupt) resume from a complete one"},
           {"missing", "\"seed\": 9,", "",
            "M: sampler.seed: missing (the checkpoint is incomplete or corrupt) resume from a "
            "complete one"},
           {"samples", "\"samples\": 30", "\"samples\": 35",
            "M: cursor.samples: 35 is not a whole number of global batches of 10 inside the data "
            "set of 1000 samples (the checkpoint is corrupt) resume from a complete one"},
           {"format", "\"flowfeed checkpoint\"", "\"something else\"",
            "M: format: expected \"flowfeed checkpoint\", found \"something else\" (not a flowfeed "
            "checkpoint) point pipeline.resume_from at a directory --checkpoint wrote"},
       }) {
    EXPECT_EQ(
        read_error(e.name, [&](std::string t) { return test::replace_once(t, e.from, e.to); }),
        e.message);
  }
  fs::path dir;
  read_error(
      "node", [](std::string t) { return t; }, &dir);
  std::ofstream(dir / "train.1.bin", std::ios::trunc) << "weightz";
  EXPECT_EQ(test::error_of<ConfigError>([&] { read_checkpoint(dir); }),
            (dir / "pipeline.json").string() +
                ": nodes.train.fnv1a64: train.1.bin hashes to b149446ef08a3539, the checkpoint "
                "says b1494b6ef08a411e (the file is corrupt) resume from a complete checkpoint");
}

Registry builtins() {
  Registry r;
  register_builtin_nodes(r);
  return r;
}

/// load (synthetic) -> stage -> upload in pull mode, unordered: the caller is the train step.
PipelineBuilder feeder(bool ordered) {
  PipelineBuilder b;
  b.epochs(2).batch_size(10).prefetch_depth(4).device(DeviceChoice::host).ordered(ordered);
  b.shuffle(3);
  b.load("synthetic", {{"samples", 95}, {"sample_shape", {2}}}).concurrency(2);
  b.stage("host_staging");
  b.upload("host_upload");
  b.mode(RunMode::pull);
  return b;
}

TEST(PullCheckpoint, CountsReleasedBatchesAndResumeSkipsOnesReleasedOutOfOrder) {
  Registry registry = builtins();
  const fs::path dir = temp_dir("pull");
  std::vector<std::pair<std::uint32_t, std::uint64_t>> seen;  // (epoch, index) in order
  {
    Pipeline pipeline = feeder(true).build(registry);
    Session session = pipeline.start();
    for (int i = 0; i < 4; ++i) {
      Batch* b = session.next();
      seen.emplace_back(b->epoch, b->index_in_epoch);
      session.release(b);
    }
    // Hold batches 4, 5 and 6; give back 4 and 6: the cursor stays at 5, with 6 finished ahead.
    Batch* b4 = session.next();
    Batch* b5 = session.next();
    Batch* b6 = session.next();
    EXPECT_EQ(session.checkpoint().samples, 40u);
    session.release(b4);
    session.release(b6);
    const Checkpoint c = session.checkpoint();
    EXPECT_EQ(c.samples, 50u);
    EXPECT_EQ(c.finished_ahead, (std::vector<std::uint64_t>{1}));
    seen.emplace_back(0, 4);
    seen.emplace_back(0, 6);
    pipeline.save_checkpoint(dir);
    session.release(b5);
  }
  PipelineBuilder resumed = feeder(true);
  resumed.resume_from(dir.string());
  Pipeline pipeline = resumed.build(registry);
  Session session = pipeline.start();
  std::vector<std::pair<std::uint32_t, std::uint64_t>> after;
  while (Batch* b = session.next()) {
    after.emplace_back(b->epoch, b->index_in_epoch);
    session.release(b);
  }
  // 5, then 7, 8, 9 and epoch 1: nothing twice, nothing lost, in order.
  std::vector<std::pair<std::uint32_t, std::uint64_t>> expected = {{0, 5}, {0, 7}, {0, 8}, {0, 9}};
  for (std::uint64_t i = 0; i < 10; ++i) expected.emplace_back(1, i);
  EXPECT_EQ(after, expected);
  const Checkpoint end = session.checkpoint();
  EXPECT_EQ(end.epoch, 2u);
  EXPECT_EQ(end.samples, 0u);
  EXPECT_TRUE(end.finished_ahead.empty());
}

/// Two branches (`pipeline.devices: [0, 0]`) of upload -> checksum, 63 batches per epoch.
std::string branch_config(bool ordered) {
  return std::string(
             "pipeline: { epochs: 2, batch_size: 16, prefetch_depth: 6, device: host, "
             "threads: 3, devices: [0, 0], ordered: ") +
         (ordered ? "true" : "false") +
         " }\n"
         "sampler: { shuffle: true, seed: 9 }\n"
         "nodes:\n"
         "  - { name: load, type: synthetic, concurrency: 2, params: { samples: 1000, "
         "sample_shape: [3], seed: 3 } }\n"
         "  - { name: upload, type: host_upload, concurrency: 2 }\n"
         "  - { name: train, type: checksum }\n";
}

TEST(RunCheckpoint, EveryNStepsOnTheTrainThreadAndResumedAcrossBranches) {
  Registry registry = builtins();
  for (bool ordered : {true, false}) {
    const fs::path dir = temp_dir(ordered ? "branches_o" : "branches_u");
    {
      Pipeline p(load_config_string(branch_config(ordered), registry), registry);
      RunOptions options;
      options.stop_after = 40;
      options.checkpoint_dir = dir.string();
      options.checkpoint_every = 7;
      const RunReport r = p.run(options);
      EXPECT_FALSE(r.interrupted);
      EXPECT_EQ(r.batches, 40u);
      // Written from the train threads after 7, 14, ..., 35 finished steps (the other branch may
      // finish a few more while one writes); the last one stays.
      EXPECT_GE(read_checkpoint(dir).steps, 35u);
      EXPECT_LE(read_checkpoint(dir).steps, 40u);
      p.save_checkpoint(dir);
    }
    const Checkpoint c = read_checkpoint(dir);
    EXPECT_EQ(c.steps, 40u);
    EXPECT_EQ(c.epoch, 0u);
    EXPECT_EQ(c.samples, 40u * 16);
    PipelineConfig config = load_config_string(branch_config(ordered), registry);
    config.pipeline.resume_from = dir.string();
    Pipeline p(config, registry);
    const RunReport r = p.run();
    // The rest of epoch 0 and all of epoch 1, each epoch ended on both branches (checksum counts
    // every sample of the shard once per epoch), nothing lost.
    EXPECT_EQ(r.batches, 63u * 2 - 40);
    EXPECT_EQ(r.samples, 2000u - 40 * 16);
    const Checkpoint end = p.checkpoint();
    EXPECT_EQ(end.epoch, 2u);
    EXPECT_EQ(end.steps, 126u);
  }
}

}  // namespace
}  // namespace flowfeed
