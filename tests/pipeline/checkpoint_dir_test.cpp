// The checkpoint directory as a hostile user meets it: it removes only files it listed, refuses a
// directory that holds others and a second writer, and every file it reads back is read with
// bounds and every number in it checked before it is used.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "flowfeed/checkpoint.hpp"
#include "flowfeed/sampler.hpp"
#include "tests/error_of.hpp"
#include "tests/files.hpp"
#include "tests/temp_fifo.hpp"

namespace flowfeed {
namespace {
// Named apart from the helpers of the test files it shares a unity group with.
namespace checkpoint_dir_test {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  return test::fresh_path("ckdir", name);
}

std::set<std::string> names(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

const std::map<std::string, std::pair<std::string, std::string>> kState = {
    {"train", {"mlp", "weights"}}};

/// Replaces the directory's list of its files (flowfeed-files.json) with one naming `files`.
void write_file_list(const fs::path& dir, const std::string& files) {
  std::ofstream(dir / "flowfeed-files.json", std::ios::trunc)
      << "{\"format\": \"flowfeed checkpoint files\", \"files\": [" << files << "]}";
}

Checkpoint at(std::uint64_t next) {
  return make_checkpoint(Sampler(SamplerOptions{true, 9, false, 0, 1}, 1000, 10), next, {}, next);
}

std::string own_dir_refusal(const fs::path& dir, const std::string& file) {
  return dir.string() + ": holds " + file +
         ", which this checkpoint did not write (--checkpoint removes the files of its older "
         "checkpoints, so it takes only a directory of its own) give --checkpoint an empty or new "
         "directory";
}

TEST(CheckpointDir, ADirectoryOfOtherFilesIsRefusedAndLeftAsItWas) {
  const fs::path dir = temp_dir("data");
  fs::create_directories(dir);
  std::ofstream(dir / "train.bin") << "tokens";
  std::ofstream(dir / "val.bin") << "more tokens";
  std::ofstream(dir / "x.tmp") << "a user's temporary file";
  EXPECT_EQ(test::error_of<ConfigError>([&] { write_checkpoint(dir, at(3), kState); }),
            own_dir_refusal(dir, "train.bin"));
  EXPECT_EQ(names(dir), (std::set<std::string>{"train.bin", "val.bin", "x.tmp"}));
  EXPECT_EQ(test::read_file(dir / "train.bin"), "tokens");
  EXPECT_EQ(test::read_file(dir / "val.bin"), "more tokens");
}

TEST(CheckpointDir, AFileAddedToACheckpointIsRefusedAndNotRemoved) {
  const fs::path dir = temp_dir("added");
  write_checkpoint(dir, at(3), kState);
  std::ofstream(dir / "notes.bin") << "mine";
  EXPECT_EQ(test::error_of<ConfigError>([&] { write_checkpoint(dir, at(4), kState); }),
            own_dir_refusal(dir, "notes.bin"));
  EXPECT_EQ(test::read_file(dir / "notes.bin"), "mine");
  EXPECT_EQ(read_checkpoint(dir).samples, 30u);
  // A report written over the manifest's name is not a manifest of ours either.
  const fs::path other = temp_dir("report");
  fs::create_directories(other);
  std::ofstream(other / "pipeline.json") << "{\"batches\": 3}\n";
  EXPECT_EQ(test::error_of<ConfigError>([&] { CheckpointDir d(other.string()); }),
            other.string() +
                ": holds pipeline.json, which is not a checkpoint manifest flowfeed wrote "
                "(--checkpoint removes the files of its older checkpoints, so it takes only a "
                "directory of its own) give --checkpoint an empty or new directory");
  EXPECT_EQ(names(other), (std::set<std::string>{"pipeline.json"}));
  // Nor is a device of that name, which is not read.
  const fs::path device = temp_dir("device");
  fs::create_directories(device);
  fs::create_symlink("/dev/zero", device / "pipeline.json");
  EXPECT_EQ(test::error_of<ConfigError>([&] { CheckpointDir d(device.string()); }),
            device.string() +
                ": holds pipeline.json, which is not a checkpoint manifest flowfeed wrote "
                "(--checkpoint removes the files of its older checkpoints, so it takes only a "
                "directory of its own) give --checkpoint an empty or new directory");
}

TEST(CheckpointDir, AnExistingCheckpointIsContinuedAndWhatACrashLeftIsRemoved) {
  const fs::path dir = temp_dir("continued");
  write_checkpoint(dir, at(3), kState);
  // A write that crashed after the list named generation 2 and its node file was half written,
  // and while the manifest was replaced.
  write_file_list(dir, "\"train.1.bin\", \"train.2.bin\", \"train.2.bin.tmp\"");
  std::ofstream(dir / "train.2.bin.tmp") << "wei";
  std::ofstream(dir / "pipeline.json.tmp") << "{\"form";
  EXPECT_EQ(read_checkpoint(dir).samples, 30u);
  write_checkpoint(dir, at(5), kState);
  EXPECT_EQ(names(dir), (std::set<std::string>{"flowfeed-files.json", "flowfeed.lock",
                                               "pipeline.json", "train.2.bin"}));
  EXPECT_EQ(read_checkpoint(dir).samples, 50u);
  // A checkpoint written before the file list existed is ours by its manifest, with what a crash
  // of its next write left.
  fs::remove(dir / "flowfeed-files.json");
  fs::remove(dir / "flowfeed.lock");
  std::ofstream(dir / "train.3.bin.tmp") << "wei";
  write_checkpoint(dir, at(6), kState);
  EXPECT_EQ(names(dir), (std::set<std::string>{"flowfeed-files.json", "flowfeed.lock",
                                               "pipeline.json", "train.3.bin"}));
}

TEST(CheckpointDir, AListThatNamesAFileOtherThanANodeFileIsRefused) {
  // Otherwise the next write would remove what it names: here the manifest itself.
  const fs::path dir = temp_dir("bad_list");
  write_checkpoint(dir, at(3), kState);
  write_file_list(dir, "\"train.1.bin\", \"pipeline.json\"");
  EXPECT_EQ(test::error_of<ConfigError>([&] { write_checkpoint(dir, at(4), kState); }),
            dir.string() +
                ": flowfeed-files.json: 'pipeline.json' is not a node file (node files are "
                "NAME.GENERATION.bin; the file is corrupt) give --checkpoint an empty or new "
                "directory");
  EXPECT_EQ(read_checkpoint(dir).samples, 30u);
}

TEST(CheckpointDir, ASecondWriterIsRefusedNamingTheHolder) {
  const fs::path dir = temp_dir("locked");
  {
    CheckpointDir first(dir.string());
    first.write(at(3), kState);
    EXPECT_EQ(test::read_file(dir / "flowfeed.lock"),
              "flowfeed checkpoint lock\npid " + std::to_string(getpid()) + "\n");
    EXPECT_EQ(test::error_of<ConfigError>([&] { CheckpointDir second(dir.string()); }),
              dir.string() + ": another run (pid " + std::to_string(getpid()) +
                  ") holds this checkpoint directory (its lock flowfeed.lock; two writers would "
                  "remove each other's files) give this run its own --checkpoint directory, or "
                  "wait until that run ends");
    EXPECT_EQ(
        test::error_of<ConfigError>([&] { write_checkpoint(dir, at(4), kState); }).substr(0, 40),
        (dir.string() + ": another run (pid").substr(0, 40));
  }
  write_checkpoint(dir, at(4), kState);  // released with the first writer
  EXPECT_EQ(read_checkpoint(dir).samples, 40u);
}

TEST(CheckpointDir, APathThatCannotBeAnOwnDirectoryIsRefusedBeforeAnyWrite) {
  const fs::path base = temp_dir("paths");
  fs::create_directories(base);
  std::ofstream(base / "file") << "x";
  const std::string below = (base / "file" / "ck").string();
  EXPECT_EQ(test::error_of<ConfigError>([&] { CheckpointDir d(below); }),
            below +
                ": cannot create the checkpoint directory (Not a directory) give --checkpoint a "
                "directory that can be written");
  EXPECT_EQ(test::error_of<ConfigError>([&] { CheckpointDir d((base / "file").string()); }),
            (base / "file").string() +
                ": is not a directory (a checkpoint is a directory of files) give --checkpoint an "
                "empty or new directory");
  EXPECT_EQ(test::read_file(base / "file"), "x");
}

/// The message of read_checkpoint(path), the manifest's path written as M.
std::string read_message(const std::string& path, const std::string& manifest) {
  const std::string m = test::error_of<ConfigError>([&] { read_checkpoint(path); });
  return m.rfind(manifest, 0) == 0 ? std::string("M").append(m, manifest.size()) : m;
}

const std::string kFix = "point pipeline.resume_from (--resume) at a directory --checkpoint wrote";

TEST(CheckpointRead, DevicesFifosDirectoriesAndHugeFilesAreRefusedUnread) {
  EXPECT_EQ(read_message("/dev/zero", "/dev/zero"),
            "M: is a character device, not a checkpoint manifest file (a device such as /dev/zero "
            "gives bytes without end) " +
                kFix);
  const fs::path dir = temp_dir("bounded");
  fs::create_directories(dir);
  const test::TempFifo fifo((dir / "fifo").string());
  ASSERT_TRUE(fifo.made());
  EXPECT_EQ(read_message(fifo.path(), fifo.path()),
            "M: is a FIFO, not a checkpoint manifest file (a pipe waits for a writer and may give "
            "bytes without end) " +
                kFix);
  const std::string manifest = (dir / "pipeline.json").string();
  EXPECT_EQ(read_message(dir.string(), manifest),
            "M: cannot open checkpoint manifest (No such file or directory)");
  fs::create_directories(dir / "pipeline.json");
  EXPECT_EQ(read_message(dir.string(), manifest),
            "M: is a directory, not a checkpoint manifest file (" + kFix + ")");
  fs::remove(dir / "pipeline.json");
  std::ofstream(manifest) << "{}";
  ASSERT_EQ(truncate(manifest.c_str(), 17 << 20), 0);  // sparse
  EXPECT_EQ(read_message(dir.string(), manifest),
            "M: the file holds 17.0 MiB, too large for a checkpoint manifest (a checkpoint "
            "manifest holds at most 16.0 MiB; a checkpoint's files are regular files of the sizes "
            "its manifest gives) check that this is the checkpoint manifest file");
  // A node file replaced by a FIFO or a device is not opened.
  const fs::path ck = temp_dir("bounded_node");
  write_checkpoint(ck, at(3), kState);
  fs::remove(ck / "train.1.bin");
  fs::create_symlink("/dev/zero", ck / "train.1.bin");
  EXPECT_EQ(read_message(ck.string(), (ck / "pipeline.json").string()),
            "M: nodes.train.file: " + (ck / "train.1.bin").string() +
                ": is a character device, not a checkpoint node state file (a device such as "
                "/dev/zero gives bytes without end) " +
                kFix);
}

/// The message of reading, then resuming a 2-epoch run of 1000 samples in batches of 10 from, a
/// checkpoint whose manifest `edit` changed (M: the manifest's path).
std::string resume_message(const std::string& name,
                           const std::function<std::string(std::string)>& edit,
                           std::uint64_t next = 3, std::vector<std::uint64_t> ahead = {}) {
  const fs::path dir = temp_dir(name);
  Sampler s(SamplerOptions{true, 9, false, 0, 1}, 1000, 10);
  for (auto& a : ahead) a += next;
  write_checkpoint(dir, make_checkpoint(s, next, ahead, next), kState);
  const fs::path manifest = dir / "pipeline.json";
  const std::string text = edit(test::read_file(manifest));
  std::ofstream(manifest, std::ios::trunc) << text;
  try {
    const Checkpoint c = read_checkpoint(dir);
    resume_point(c, s, 2, manifest.string());
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    return m.rfind(manifest.string(), 0) == 0 ? std::string("M").append(m, manifest.string().size())
                                              : m;
  }
  return "accepted";
}

TEST(CheckpointRead, AProductThatOverflowsIsAnErrorNamingTheField) {
  // 2^63 x 2 wraps to 0: the global batch check then divided by it.
  EXPECT_EQ(resume_message("overflow",
                           [](std::string t) {
                             t = test::replace_once(t, "\"world\": 1", "\"world\": 2");
                             t = test::replace_once(t, "\"batch_size\": 10",
                                                    "\"batch_size\": 9223372036854775808");
                             return test::replace_once(t, "\"global_batch\": 10",
                                                       "\"global_batch\": 0");
                           }),
            "M: cursor.batch_size: 9223372036854775808 x cursor.world 2 overflows 64 bits "
            "(allowed: a batch_size whose product with cursor.world is below 2^64; the checkpoint "
            "is corrupt) resume from a complete one");
  EXPECT_EQ(resume_message("steps",
                           [](std::string t) {
                             return test::replace_once(t, "\"steps\": 3",
                                                       "\"steps\": 18446744073709551615");
                           }),
            "M: cursor.steps: 18446744073709551615 is out of range (allowed: 0 to "
            "18446744073709551415, so that the count of a run of 200 batches fits 64 bits; the "
            "checkpoint is corrupt) resume from a complete one");
}

TEST(CheckpointRead, PositionsOutsideTheRunAreErrorsNamingTheAllowedRange) {
  EXPECT_EQ(resume_message("ok", [](std::string t) { return t; }, 3, {2, 5}), "accepted");
  EXPECT_EQ(resume_message("epoch_past",
                           [](std::string t) {
                             return test::replace_once(t, "\"epoch\": 0", "\"epoch\": 7");
                           }),
            "M: cursor.epoch: the checkpoint is at epoch 7, sample 30 of its order: nothing of "
            "this run's 2 epochs is left after it (allowed: an epoch below pipeline.epochs with a "
            "batch of this rank left in it) raise pipeline.epochs to train further, or start "
            "without pipeline.resume_from");
  // The end of a finished run: nothing is left to run.
  EXPECT_EQ(resume_message(
                "finished", [](std::string t) { return t; }, 200),
            "M: cursor.epoch: the checkpoint is at epoch 2, sample 0 of its order: nothing of "
            "this run's 2 epochs is left after it (allowed: an epoch below pipeline.epochs with a "
            "batch of this rank left in it) raise pipeline.epochs to train further, or start "
            "without pipeline.resume_from");
  EXPECT_EQ(resume_message("ahead_huge",
                           [](std::string t) {
                             return test::replace_once(
                                 t, "\"finished_ahead\": [\n      2",
                                 "\"finished_ahead\": [\n      18446744073709551615");
                           },
                           3, {2}),
            "M: cursor.finished_ahead: 18446744073709551615 is past the end of the run: 196 "
            "batches of this rank follow the cursor's in 2 epochs (allowed: ascending offsets 1 "
            "to 196; the checkpoint is corrupt or from a longer run) resume from a complete "
            "checkpoint of this run");
  std::string long_list = "\"finished_ahead\": [";
  for (int i = 1; i <= 300; ++i) {
    if (i > 1) long_list += ',';
    long_list += std::to_string(i);
  }
  EXPECT_EQ(resume_message("ahead_long",
                           [&](std::string t) {
                             return test::replace_once(t, "\"finished_ahead\": []",
                                                       long_list + "]");
                           }),
            "M: cursor.finished_ahead: 300 is past the end of the run: 196 batches of this rank "
            "follow the cursor's in 2 epochs (allowed: ascending offsets 1 to 196; the checkpoint "
            "is corrupt or from a longer run) resume from a complete checkpoint of this run");
  // Each field edited to a value out of its range or of another type, and what the resume says.
  for (const test::EditCase& e : std::initializer_list<test::EditCase>{
           {"ahead_negative", "\"finished_ahead\": []", "\"finished_ahead\": [-1]",
            "M: cursor.finished_ahead: expected a list of non-negative integers, found [-1] (the "
            "checkpoint is corrupt) resume from a complete one"},
           {"ahead_type", "\"finished_ahead\": []", "\"finished_ahead\": {\"a\": 1}",
            "M: cursor.finished_ahead: expected a list of non-negative integers, found {\"a\":1} "
            "(the "
            "checkpoint is corrupt) resume from a complete one"},
           {"negative", "\"epoch\": 0", "\"epoch\": -1",
            "M: cursor.epoch: expected a non-negative integer, found -1 (the checkpoint is "
            "corrupt) resume from a complete one"},
           {"fraction", "\"samples\": 30", "\"samples\": 30.5",
            "M: cursor.samples: expected a non-negative integer, found 30.5 (the checkpoint is "
            "corrupt) resume from a complete one"},
           {"epoch_range", "\"epoch\": 0", "\"epoch\": 4294967296",
            "M: cursor.epoch: 4294967296 is out of range (0 to 4294967295; the checkpoint is "
            "corrupt) resume from a complete one"},
           {"file_dots", "\"file\": \"train.1.bin\"", "\"file\": \"..\"",
            "M: nodes.train.file: '..' is not a file name inside the checkpoint"},
       }) {
    EXPECT_EQ(
        resume_message(e.name, [&](std::string t) { return test::replace_once(t, e.from, e.to); }),
        e.message);
  }
}

TEST(CheckpointRead, DeepNestingIsRefusedBeforeParsingAndAnyNodeNameIsFound) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(resume_message("deep", [&](const std::string&) { return deep; }),
            "M: not a checkpoint: nested 100000 levels deep (a manifest nests 3; the file is "
            "corrupt) resume from a complete checkpoint");
  // Node names are keys of their own, whatever they hold.
  const fs::path dir = temp_dir("names");
  const std::string long_name(100, 'n');
  write_checkpoint(dir, at(3), {{"a.b", {"mlp", "one"}}, {long_name, {"mlp", "two"}}});
  const Checkpoint c = read_checkpoint(dir);
  EXPECT_EQ(read_node_state(c, "a.b"), "one");
  EXPECT_EQ(read_node_state(c, long_name), "two");
}

TEST(CheckpointRead, ANumberBeyondADoubleIsACorruptFileNotACrash) {
  // JSON allows it; nlohmann's parser refuses it with an out_of_range, not a parse_error.
  EXPECT_EQ(resume_message("huge_number",
                           [](std::string text) {
                             return text.replace(text.find("\"version\": 1"), 12,
                                                 "\"version\": 1e3001");
                           }),
            "M: not a checkpoint: number overflow parsing '1e3001' (the file is truncated or "
            "corrupt) resume from a complete checkpoint");
}

TEST(CheckpointRead, ANodeStateLargerThanTheMemoryThereIsIsRefusedUnread) {
  const fs::path dir = temp_dir("memory");
  write_checkpoint(dir, at(3), {{"train", {"mlp", std::string(5000, 'w')}}});
  setenv("FLOWFEED_AVAILABLE_MEMORY", "4K", 1);
  const std::string m = read_message(dir.string(), (dir / "pipeline.json").string());
  unsetenv("FLOWFEED_AVAILABLE_MEMORY");
  EXPECT_EQ(m,
            "M: nodes.train.bytes: train.1.bin holds 4.9 KiB, more than the 4.0 KiB of memory "
            "available (FLOWFEED_AVAILABLE_MEMORY) resume on a machine with more memory, or from "
            "a checkpoint of this pipeline");
  EXPECT_EQ(read_node_state(read_checkpoint(dir), "train"), std::string(5000, 'w'));
}

TEST(CheckpointRead, FinishedAheadOfOneRankIsNotResumedOnAnother) {
  // Rank 0 of 2 finished its batch 5 ahead of the cursor at 3: rank 1 must not skip its own 5.
  const Checkpoint c =
      make_checkpoint(Sampler(SamplerOptions{true, 9, false, 0, 2}, 1000, 5), 3, {5}, 4);
  EXPECT_EQ(test::error_of<ConfigError>([&] {
              resume_point(c, Sampler(SamplerOptions{true, 9, false, 1, 2}, 1000, 5), 2, "ck");
            }),
            "ck: cursor.rank: the checkpoint was written by rank 0 with 1 batches finished after "
            "the cursor out of order, this run is rank 1 (those batches are of rank 0's shard) "
            "resume rank 1 from rank 1's checkpoint (--resume DIR with {rank})");
  EXPECT_EQ(resume_point(c, Sampler(SamplerOptions{true, 9, false, 0, 2}, 1000, 5), 2, "ck").skip,
            (std::vector<std::uint64_t>{5}));
}

// Every seed of the checkpoint fuzzer's corpus is read or refused with a ConfigError, as the fuzzer
// (tests/fuzz/checkpoint_fuzz.cpp) runs it, nothing else.
TEST(CheckpointRead, FuzzSeedCorpusReadsOrIsRefused) {
  const fs::path dir = temp_dir("corpus");
  fs::create_directories(dir);
  Sampler s(SamplerOptions{true, 9, false, 0, 1}, 1000, 10);
  int seeds = 0, accepted = 0;
  for (const auto& seed :
       fs::directory_iterator(fs::path(FLOWFEED_SOURCE_DIR) / "tests/fuzz/checkpoint_corpus")) {
    const std::string input = test::read_file(seed.path());
    const std::size_t nul = input.find('\0');
    std::ofstream(dir / "pipeline.json", std::ios::trunc) << input.substr(0, nul);
    fs::remove(dir / "flowfeed-files.json");
    if (nul != std::string::npos) {
      std::ofstream(dir / "flowfeed-files.json") << input.substr(nul + 1);
    }
    std::ofstream(dir / "train.1.bin", std::ios::trunc) << "weights";
    ++seeds;
    try {
      resume_point(read_checkpoint(dir), s, 2, "seed");
      ++accepted;
    } catch (const ConfigError&) {
    }
    try {
      CheckpointDir held(dir.string());
    } catch (const ConfigError&) {
    }
  }
  EXPECT_GE(seeds, 6);
  EXPECT_GE(accepted, 2) << "the corpus holds checkpoints this run resumes from";
}

}  // namespace checkpoint_dir_test
}  // namespace
}  // namespace flowfeed
