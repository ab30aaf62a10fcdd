// The webdataset loader's bad input: every corruption class with its full message, at build or
// for its batch, on_error: skip dropping exactly the bad samples, and contradictory params.
#include <sstream>
#include <tuple>

#include "flowfeed/session.hpp"
#include "tests/nodes/webdataset_fixture.hpp"

namespace flowfeed {
namespace {

using namespace webdataset_testing;

/// The message of batch 0 failing for sample `index` of `tar` (member s00`index`.`ext`, at its
/// offset in the shard `name`): `why`.
std::string bad_sample_in_batch_0(const std::string& tar, const std::string& name, int index,
                                  const std::string& why, const char* ext = "jpg") {
  return fmt::format(
      "{} batch 0 (epoch 0): {}: sample 's00{}' (member 's00{}.{}' at offset {}): {}", kLoad, tar,
      index, index, ext, header_of(name, index, ext), why);
}

/// The message of batch 0 when its sample `sample` of `tar` (at `offset`), a text and not a
/// JPEG, is dropped once more than max_skipped allows: `dropped` samples dropped in all.
std::string not_a_jpeg_past_max_skipped(const std::string& tar, const std::string& sample,
                                        std::uint64_t offset, int dropped, int max_skipped) {
  return fmt::format(
      "{} batch 0 (epoch 0): {}: sample '{}' (member '{}.jpg' at offset {}): not a decodable JPEG "
      "(Not a JPEG file: starts with 0x68 0x65) ({} samples dropped, more than "
      "pipeline.max_skipped = {})",
      kLoad, tar, sample, sample, offset, dropped, max_skipped);
}

/// Under on_error: skip (one sample at most), the run over `tar` with `params` drops its one bad
/// sample and delivers the other three.
void expect_bad_sample_skipped(const std::string& tar, const std::string& params) {
  const Outcome r = run(chain(tar, params, ", on_error: skip, max_skipped: 1"));
  EXPECT_EQ(r.report.samples, 3u);
  EXPECT_EQ(r.report.skipped_samples, 1u);
}

TEST(WebDatasetErrors, TruncatedTarFailsTheBuildWithItsOffset) {
  const std::string tar = corrupt_tar("truncated");
  // The shard is "whole" cut 100 bytes into the header of its sample 3.
  const std::uint64_t cut = header_of("whole", 3);
  EXPECT_EQ(build_error(chain(tar, "")),
            fmt::format("{}: {}: truncated tar: the file ends 100 bytes into the header block at "
                        "offset {} (a header is 512 bytes; was the shard cut short while it was "
                        "written or copied?)",
                        kLoad, tar, cut));
}

TEST(WebDatasetErrors, MemberCutShortFailsTheBuildUnlessSkipped) {
  const std::string tar = corrupt_tar("cut_short");
  EXPECT_EQ(build_error(chain(tar, "")),
            fmt::format("{}: {}: sample 's003' (member 's003.jpg' at offset {}): the member is cut "
                        "short (the shard ends before the size its header declares) (set "
                        "pipeline.on_error: skip to drop such samples)",
                        kLoad, tar, header_of("whole", 3)));
  expect_bad_sample_skipped(tar, "");
}

TEST(WebDatasetErrors, SampleWithoutLabelFailsTheBuild) {
  const std::string tar = corrupt_tar("no_label");
  EXPECT_EQ(build_error(chain(tar, "")),
            fmt::format("{}: {}: sample 's002' (member 's002.jpg' at offset {}): no label member "
                        "(.cls) (set pipeline.on_error: skip to drop such samples)",
                        kLoad, tar, header_of("no_label", 2)));
}

TEST(WebDatasetErrors, UndecodableImagesFailTheirBatchNamingShardMemberAndOffset) {
  const std::string text = corrupt_tar("not_image");
  EXPECT_EQ(run_error(chain(text, "")),
            bad_sample_in_batch_0(text, "not_image", 2,
                                  "not a decodable JPEG (Not a JPEG file: starts with 0x68 0x65)"));
  const std::string empty = corrupt_tar("zero_byte");
  EXPECT_EQ(run_error(chain(empty, "")),
            bad_sample_in_batch_0(empty, "zero_byte", 2, "empty image (0 bytes)"));
  const std::string label = corrupt_tar("bad_label");
  EXPECT_EQ(run_error(chain(label, "")),
            bad_sample_in_batch_0(label, "bad_label", 2,
                                  "label 'two' in its .cls member is not an integer"));
  EXPECT_EQ(
      run_error(chain(corrupt_tar("whole"), ", num_classes: 3")),
      bad_sample_in_batch_0(corrupt_tar("whole"), "whole", 3, "label 3 is out of range [0, 3)"));
}

TEST(WebDatasetErrors, AJpegCutShortFailsWhenItsCropNeedsTheMissingRows) {
  // The whole 32x24 image is the crop: libjpeg reaches the end of the data before its last rows
  // (it would fill them with grey) and the sample fails.
  const Shards& s = corrupt();
  const std::string tar = s.file("cut_jpeg.tar");
  EXPECT_EQ(
      run_error(chain(tar, ", height: 24, width: 32, crop: center, resize: 24")),
      bad_sample_in_batch_0(tar, "cut_jpeg", 2, "corrupt JPEG data (Premature end of JPEG file)"));
  expect_bad_sample_skipped(tar, ", height: 24, width: 32, crop: center, resize: 24");
}

TEST(WebDatasetErrors, AJpegClosedEarlyIsABadSampleNotAGreyCrop) {
  // The entropy-coded data stops halfway and an EOI marker follows: libjpeg only warns (and PIL
  // loads it) but the lower rows would be grey.
  const std::string tar = corrupt_tar("cut_jpeg_eoi");
  const std::string params = ", height: 24, width: 32, crop: center, resize: 24";
  EXPECT_EQ(run_error(chain(tar, params)),
            bad_sample_in_batch_0(tar, "cut_jpeg_eoi", 2,
                                  "corrupt JPEG data (Corrupt JPEG data: premature end of data "
                                  "segment)"));
  expect_bad_sample_skipped(tar, params);
}

TEST(WebDatasetErrors, ACutProgressiveJpegFailsWhateverItsCrop) {
  // Every scan is read before the first row comes out: even a crop of the top rows lacks data.
  const std::string tar = corrupt_tar("cut_progressive");
  EXPECT_EQ(run_error(chain(tar, ", height: 4, width: 4, scale_min: 0.05, scale_max: 0.1")),
            bad_sample_in_batch_0(tar, "cut_progressive", 2,
                                  "corrupt JPEG data (Premature end of JPEG file)"));
}

TEST(WebDatasetErrors, ACutPngIsABadSample) {
  const std::string tar = corrupt_tar("cut_png");
  EXPECT_EQ(run_error(chain(tar, ", height: 24, width: 32, crop: center, resize: 24")),
            bad_sample_in_batch_0(tar, "cut_png", 2, "not a decodable PNG (Not enough image data)",
                                  "png"));
  expect_bad_sample_skipped(tar, ", height: 8, width: 8");
}

TEST(WebDatasetErrors, ADecompressionBombIsRefusedFromItsHeader) {
  // 60000x60000 declared over a few bytes: 10 GiB of pixels, never allocated.
  const std::string tar = corrupt_tar("bomb");
  const std::string bad = fmt::format(
      "{}: sample 's002' (member 's002.png' at offset {}): the image declares 60000x60000 = "
      "3600000000 pixels, more than max_pixels = 89478485 (a decompression bomb, or a larger "
      "image than expected: raise nodes.load.params.max_pixels to accept it)",
      tar, header_of("bomb", 2, "png"));
  EXPECT_EQ(run_error(chain(tar, "")), fmt::format("{} batch 0 (epoch 0): {}", kLoad, bad));
  expect_bad_sample_skipped(tar, ", height: 8, width: 8");
  // The limit is a param: a lower one refuses the 32x24 pictures too.
  EXPECT_EQ(
      run_error(chain(corrupt_tar("whole"), ", height: 8, width: 8, max_pixels: 767")),
      bad_sample_in_batch_0(corrupt_tar("whole"), "whole", 0,
                            "the image declares 32x24 = 768 pixels, more than max_pixels = 767 "
                            "(a decompression bomb, or a larger image than expected: raise "
                            "nodes.load.params.max_pixels to accept it)"));
}

TEST(WebDatasetErrors, EachSampleOfAWhollyBadBatchCountsAgainstMaxSkipped) {
  const std::string tar = corrupt_tar("all_bad");
  // One batch of four bad samples is four dropped samples, not one skipped batch.
  EXPECT_EQ(run_error(chain(tar, "", ", batch_size: 4, on_error: skip, max_skipped: 3")),
            not_a_jpeg_past_max_skipped(tar, "b0", header_of("all_bad", 0), 4, 3));
}

TEST(WebDatasetErrors, ARunThatDeliversNoSampleFails) {
  const std::string tar = corrupt_tar("all_bad");
  Registry r;
  register_builtin_nodes(r);
  register_capture(r, std::make_shared<Captured>());
  Pipeline p(
      load_config_string(chain(tar, "", ", batch_size: 2, on_error: skip, max_skipped: 100"), r),
      r);
  ::testing::internal::CaptureStderr();
  const std::string message = error_of<DataError>([&] { p.run(); });
  ::testing::internal::GetCapturedStderr();
  const std::string expected =
      "the run delivered no sample: all 4 were dropped as bad under pipeline.on_error: skip (2 "
      "batches skipped; the errors are above, and under \"warnings\" in --report) fix or remove "
      "the bad data";
  EXPECT_EQ(message, expected);
  // Pulled batches alike: the call that would have said "no more" says so instead.
  Pipeline pull(load_config_string(
                    fmt::format("pipeline: {{ device: host, mode: pull, batch_size: 2, on_error: "
                                "skip, max_skipped: 100 }}\n"
                                "nodes:\n"
                                "  - {{ name: load, type: webdataset, params: {{ shards: '{}' }} "
                                "}}\n",
                                tar),
                    r),
                r);
  Session session = pull.start();
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(error_of<DataError>([&] { EXPECT_EQ(session.next(), nullptr); }), expected);
  ::testing::internal::GetCapturedStderr();
}

TEST(WebDatasetErrors, DroppedSamplesAreSaidOnStderrTheFirstFiveInFull) {
  const std::string tar = corrupt_tar("mixed");
  ::testing::internal::CaptureStderr();
  Outcome r = run(chain(tar, "", ", epochs: 2, batch_size: 5, on_error: skip, max_skipped: 6"), 2);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.report.skipped_samples, 6u);
  const auto line = [&](std::uint32_t sample, int batch, int epoch, const std::string& key,
                        const std::string& why) {
    return fmt::format(
        "flowfeed: node 'load' (webdataset): dropped sample {} of batch {} (epoch {}): {}: "
        "sample '{}' (member '{}.jpg' at offset {}): {}\n",
        sample, batch, epoch, tar, key, key, header_of("mixed", static_cast<int>(sample)), why);
  };
  const std::string text = "not a decodable JPEG (Not a JPEG file: starts with 0x68 0x65)";
  const std::string empty = "empty image (0 bytes)";
  const std::string label = "no label member (.cls)";
  EXPECT_EQ(err, line(3, 0, 0, "bad_text", text) + line(7, 1, 0, "bad_empty", empty) +
                     line(11, 2, 0, "bad_nolabel", label) + line(3, 3, 1, "bad_text", text) +
                     line(7, 4, 1, "bad_empty", empty) +
                     "flowfeed: node 'load' (webdataset): 6 samples dropped in all "
                     "(pipeline.on_error: skip; the first 5 are shown above)\n");
}

TEST(WebDatasetErrors, SkipDropsExactlyTheBadSamplesAndNamesThem) {
  const std::string tar = corrupt_tar("mixed");
  Outcome r = run(chain(tar, "", ", epochs: 2, batch_size: 5, on_error: skip, max_skipped: 6"), 2);
  EXPECT_EQ(r.report.samples, 20u);
  EXPECT_EQ(r.report.skipped_samples, 6u);
  EXPECT_EQ(r.report.skipped_batches, 0u);
  // Every good sample arrives with its own label; the bad ones (3, 7, 11) never do.
  const Json& m = corrupt().manifest()["mixed"];
  for (const auto& [key, bytes] : r.x) {
    EXPECT_NE(key.second, 3u);
    EXPECT_NE(key.second, 7u);
    EXPECT_NE(key.second, 11u);
    EXPECT_EQ(r.y.at(key.second), m[key.second]["label"].get<int>());
  }
  // Batch 0 holds samples 0-4 less sample 3; the labels moved down with their images.
  EXPECT_EQ(r.seen->samples[0], (std::vector<std::uint32_t>{0, 1, 2, 4}));
  EXPECT_EQ(r.seen->y[0], (std::vector<std::int32_t>{0, 1, 2, 3}));
  ASSERT_EQ(r.report.warnings.size(), 6u);
  EXPECT_EQ(r.report.warnings[0],
            fmt::format("skipped: node 'load' (webdataset): dropped sample 3 of batch 0 (epoch 0): "
                        "{}: sample 'bad_text' (member 'bad_text.jpg' at offset {}): not a "
                        "decodable JPEG (Not a JPEG file: starts with 0x68 0x65)",
                        tar, header_of("mixed", 3)));

  // One more than max_skipped ends the run.
  EXPECT_EQ(run_error(chain(tar, "", ", batch_size: 13, on_error: skip, max_skipped: 2")),
            not_a_jpeg_past_max_skipped(tar, "bad_text", header_of("mixed", 3), 3, 2));
}

TEST(WebDatasetErrors, BytesFieldsArriveZeroPaddedWithTheirLengths) {
  const std::string tar = corrupt_tar("fields");
  const Json& m = corrupt().manifest()["fields"];
  const std::string params = ", height: 8, width: 8, bytes_fields: 'json:32, txt:16'";
  EXPECT_EQ(build_error(chain(tar, params)),
            fmt::format("{}: {}: sample 's003' (member 's003.jpg' at offset {}): no .txt member "
                        "(bytes_fields asks for it) (set pipeline.on_error: skip to drop such "
                        "samples)",
                        kLoad, tar, header_of("fields", 3)));
  Registry r;
  register_builtin_nodes(r);
  Pipeline p(load_config_string(
                 fmt::format("pipeline: {{ device: host, mode: pull, batch_size: 5, on_error: "
                             "skip, max_skipped: 2 }}\n"
                             "nodes:\n"
                             "  - {{ name: load, type: webdataset, params: {{ shards: '{}'{} }} "
                             "}}\n",
                             tar, params),
                 r),
             r);
  Session session = p.start();
  Batch* b = session.next();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->samples, (std::vector<std::uint32_t>{0, 2, 4}));
  ASSERT_EQ(b->layout->tensors().size(), 6u);
  EXPECT_EQ(b->layout->tensors()[4].name, "txt");
  EXPECT_EQ(b->layout->tensors()[5].name, "txt_len");
  const Tier tier = b->newest_tier();
  for (std::size_t row = 0; row < 3; ++row) {
    const Json& sample = m[b->samples[row]];
    for (const auto& [index, field, max] : {std::tuple{2u, "json", 32u}, {4u, "txt", 16u}}) {
      const std::string want = sample[field];
      const auto* bytes = reinterpret_cast<const char*>(b->tensor(tier, index)) + row * max;
      const auto* len = reinterpret_cast<const std::int32_t*>(b->tensor(tier, index + 1)) + row;
      EXPECT_EQ(std::string(bytes, want.size()), want) << field << " of row " << row;
      EXPECT_EQ(std::string(bytes + want.size(), max - want.size()),
                std::string(max - want.size(), '\0'));
      EXPECT_EQ(*len, static_cast<std::int32_t>(want.size()));
    }
  }
  session.release(b);
  EXPECT_EQ(session.next(), nullptr);
  const RunReport report = session.report();
  EXPECT_EQ(report.skipped_samples, 2u);
  ASSERT_EQ(report.warnings.size(), 2u);
  EXPECT_EQ(report.warnings[0],
            fmt::format("skipped: node 'load' (webdataset): dropped sample 1 of batch 0 (epoch 0): "
                        "{}: sample 's001' (member 's001.jpg' at offset {}): its .txt member holds "
                        "40 bytes, more than the 16 of bytes_fields",
                        tar, header_of("fields", 1)));
}

// Shards named by braces, a glob, a YAML list or one comma- and space-separated string are the same
// data set in the same order; a missing or repeated shard is named when the pipeline is built.
TEST(WebDatasetErrors, ShardListsExpandAlikeAndAMissingShardIsNamed) {
  const Shards& s = photos();
  const Outcome braces = run(chain(s.file("photos-{000..002}.tar"), ", height: 8, width: 8"));
  ASSERT_EQ(braces.x.size(), 40u);
  const std::string a = s.file("photos-000.tar"), b = s.file("photos-001.tar"),
                    c = s.file("photos-002.tar");
  for (const std::string& shards :
       {"'" + s.file("photos-*.tar") + "'", "[" + a + ", '" + s.file("photos-00{1,2}.tar") + "']",
        "'" + a + ", " + b + " " + c + "'"}) {
    SCOPED_TRACE(shards);
    std::string yaml = chain("X", ", height: 8, width: 8");
    yaml.replace(yaml.find("'X'"), 3, shards);
    const Outcome other = run(yaml);
    EXPECT_EQ(other.x, braces.x);
    EXPECT_EQ(other.y, braces.y);
  }
  EXPECT_EQ(build_error(chain(s.file("photos-{000..003}.tar"), "")),
            fmt::format("{}: {}: cannot open (No such file or directory)", kLoad,
                        s.file("photos-003.tar")));
  EXPECT_EQ(build_error(chain(a + "," + s.file("photos-00[0].tar"), "")),
            fmt::format("{}: {}: named twice in shards (each file may appear once)", kLoad, a));
  EXPECT_EQ(build_error(chain(s.file("none-*.tar"), "")),
            fmt::format("{}: {}: matches no file (check the directory and the pattern)", kLoad,
                        s.file("none-*.tar")));
}

TEST(WebDatasetErrors, ContradictoryParamsAreConfigErrors) {
  Registry r;
  register_builtin_nodes(r);
  register_capture(r, std::make_shared<Captured>());
  const std::string yaml = chain(formats().file("formats.tar"),
                                 ", scale_min: 0.9, scale_max: 0.5, crop: center, resize: 10");
  const std::string message =
      error_of<ConfigError>([&] { Pipeline p(load_config_string(yaml, r), r); });
  // Line 6 holds the params; the shard path's length varies with the temp directory.
  std::istringstream lines(yaml);
  std::string line;
  for (int i = 0; i < 6; ++i) std::getline(lines, line);
  EXPECT_EQ(message,
            fmt::format("<string>:6:{}: nodes.load.params.scale_min: 0.9 is above scale_max 0.5 "
                        "(the area fraction range must not be empty)\n"
                        "<string>:6:{}: nodes.load.params.resize: 10 is smaller than the crop "
                        "224x224 (the center crop must fit in the resized image)",
                        line.find("scale_min: ") + 12, line.find("resize: ") + 9));
}

}  // namespace
}  // namespace flowfeed
