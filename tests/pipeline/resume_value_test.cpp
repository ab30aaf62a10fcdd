// Exact resume from values (Pipeline::checkpoint(NodeStates&), Pipeline::resume), what Python's
// state_dict / load_state_dict use, and LoadDefaults::implicit_pull (Python's Pipeline(...)).
#include <gtest/gtest.h>

#include <string>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

Registry registry_with_builtins() {
  Registry r;
  register_builtin_nodes(r);
  return r;
}

/// synthetic -> upload -> checksum (or none, `train` false), 1000 samples, 63 batches an epoch.
std::string chain(bool train, const std::string& pipeline_extra = "", int seed = 9) {
  return "pipeline: { epochs: 2, batch_size: 16, prefetch_depth: 4, device: host" + pipeline_extra +
         " }\nsampler: { shuffle: true, seed: " + std::to_string(seed) +
         " }\nnodes:\n"
         "  - { name: load, type: synthetic, params: { samples: 1000, sample_shape: [3], seed: 3 "
         "} }\n"
         "  - { name: upload, type: host_upload }\n" +
         (train ? "  - { name: train, type: checksum }\n" : "");
}

TEST(ResumeValue, ARunResumedFromValuesRunsTheRestOfTheSequence) {
  Registry registry = registry_with_builtins();
  Pipeline first(load_config_string(chain(true), registry), registry);
  RunOptions options;
  options.stop_after = 70;  // past the end of epoch 0
  EXPECT_EQ(first.run(options).batches, 70u);
  NodeStates states;
  const Checkpoint c = first.checkpoint(states);
  EXPECT_TRUE(states.empty());  // checksum keeps no state
  EXPECT_EQ(c.epoch, 1u);
  EXPECT_EQ(c.samples, 7u * 16);

  Pipeline resumed(load_config_string(chain(true), registry), registry);
  resumed.resume(c, states, "mem");
  EXPECT_EQ(resumed.checkpoint().samples, 7u * 16);  // before the run: where it starts
  const RunReport r = resumed.run();
  EXPECT_EQ(r.batches, 126u - 70);
  EXPECT_EQ(resumed.checkpoint().epoch, 2u);
  EXPECT_EQ(resumed.checkpoint().steps, 126u);
}

TEST(ResumeValue, ChecksTheSampleOrderTheRunAndTheNodesBeforeChangingAnything) {
  Registry registry = registry_with_builtins();
  Pipeline p(load_config_string(chain(true), registry), registry);
  Checkpoint c = p.checkpoint();
  c.samples = 3 * 16;
  Pipeline other_seed(load_config_string(chain(true, "", 10), registry), registry);
  EXPECT_EQ(test::error_of<ConfigError>([&] { other_seed.resume(c, {}, "mem"); }),
            "mem: sampler.seed: the checkpoint was written with seed 9, this run has seed 10 "
            "(every epoch's order comes from the seed) set sampler.seed: 9");
  Checkpoint past = c;
  past.epoch = 3;
  EXPECT_EQ(test::error_of<ConfigError>([&] { p.resume(past, {}, "mem"); }),
            "mem: cursor.epoch: the checkpoint is at epoch 3, sample 48 of its order: nothing of "
            "this run's 2 epochs is left after it (allowed: an epoch below pipeline.epochs with a "
            "batch of this rank left in it) raise pipeline.epochs to train further, or start "
            "without pipeline.resume_from");
  Checkpoint ahead = c;
  ahead.finished_ahead = {1, 200};
  EXPECT_EQ(test::error_of<ConfigError>([&] { p.resume(ahead, {}, "mem"); }),
            "mem: cursor.finished_ahead: 200 is past the end of the run: 122 batches of this rank "
            "follow the cursor's in 2 epochs (allowed: ascending offsets 1 to 122; the checkpoint "
            "is corrupt or from a longer run) resume from a complete checkpoint of this run");
  const NodeStates foreign = {{"train", {"mlp", "x"}}};
  EXPECT_EQ(test::error_of<ConfigError>([&] { p.resume(c, foreign, "mem"); }),
            "mem: nodes.train: this pipeline has no node 'train' that keeps state (the state is "
            "from another pipeline) resume from a state of this pipeline");
  // Nothing changed: the run starts at the beginning.
  EXPECT_EQ(p.checkpoint().samples, 0u);
  RunOptions one;
  one.stop_after = 1;
  p.run(one);
  EXPECT_EQ(p.checkpoint().samples, 16u);
}

TEST(ResumeValue, IsRefusedWhileASessionRuns) {
  Registry registry = registry_with_builtins();
  Pipeline p(load_config_string(chain(false, ", mode: pull"), registry), registry);
  const Checkpoint c = p.checkpoint();
  Session session = p.start();
  EXPECT_EQ(test::error_of<std::logic_error>([&] { p.resume(c, {}, "mem"); }),
            "Pipeline::resume: the pipeline is running (resume between runs: end the run or "
            "session first)");
}

TEST(LoadDefaults, ImplicitPullOnlyForAChainWithoutATrainNodeAndNoModeWritten) {
  Registry registry = registry_with_builtins();
  LoadDefaults implicit;
  implicit.implicit_pull = true;
  EXPECT_EQ(load_config_string(chain(false), registry, {}, "<string>", implicit).pipeline.mode,
            RunMode::pull);
  EXPECT_EQ(load_config_string(chain(true), registry, {}, "<string>", implicit).pipeline.mode,
            RunMode::run);
  const std::string last =
      "<string>:5:27: nodes[1].type: the last node must be a train node, 'upload' is a upload "
      "node (add a train-role node such as checksum, sleep or mlp)";
  // The runner's rule is unchanged, and an explicit run mode (file or override) is kept.
  EXPECT_EQ(test::problems_of([&] { load_config_string(chain(false), registry); }),
            std::vector<std::string>{last});
  EXPECT_EQ(test::problems_of([&] {
              load_config_string(chain(false, ", mode: run"), registry, {}, "<string>", implicit);
            }),
            std::vector<std::string>{last});
  EXPECT_EQ(test::problems_of([&] {
              load_config_string(chain(false), registry, {"pipeline.mode=run"}, "<string>",
                                 implicit);
            }).size(),
            1u);
}

}  // namespace
}  // namespace flowfeed
