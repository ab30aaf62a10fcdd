// s3:// shards from the S3 protocol server (tests/remote/s3_server.py, stdlib Python on
// 127.0.0.1, which verifies every request's SigV4 signature with its own implementation of the
// AWS algorithm): globs by ListObjectsV2 (several pages), path-style and virtual-host style,
// credentials from the environment and from profile files, 403 named in full, and libcurl's
// signing checked against the example AWS publishes.
#include <stdlib.h>

#include <fstream>
#include <optional>

#include "flowfeed/error.hpp"
#include "flowfeed/nodes/detail/file_set.hpp"
#include "flowfeed/remote/remote_files.hpp"
#include "http_client.hpp"
#include "tests/error_of.hpp"
#include "tests/remote/remote_fixture.hpp"

namespace flowfeed::remote_test {
namespace {

using flowfeed::test::error_of;

/// Sets (or unsets, with nullopt) an environment variable for the test's lifetime.
class EnvVar {
 public:
  EnvVar(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~EnvVar() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

constexpr const char* kKey = "AKIDFLOWFEEDTEST";
constexpr const char* kSecret = "flowfeed/test+secret/KEY";

class S3Test : public RemoteTest {
 protected:
  void start(int page_keys = 2) {
    server_ = python_server("s3_server.py",
                            {"--root", served_, "--access-key", kKey, "--secret-key", kSecret,
                             "--page-keys", std::to_string(page_keys), "--log", work_ + "/s3.log"});
  }
  std::string endpoint(const char* host = "127.0.0.1") const {
    return std::string("http://") + host + ":" + std::to_string(server_->port());
  }
  std::unique_ptr<Child> server_;
  // No profile file or variable of the machine's leaks into a test.
  EnvVar home_{"HOME", tmp_.file("home")};
  EnvVar profile_{"AWS_PROFILE", std::nullopt};
  EnvVar credentials_file_{"AWS_SHARED_CREDENTIALS_FILE", std::nullopt};
  EnvVar config_file_{"AWS_CONFIG_FILE", std::nullopt};
  EnvVar key_{"AWS_ACCESS_KEY_ID", std::nullopt};
  EnvVar secret_{"AWS_SECRET_ACCESS_KEY", std::nullopt};
  EnvVar token_{"AWS_SESSION_TOKEN", std::nullopt};
  EnvVar region_{"AWS_REGION", "eu-west-3"};
  EnvVar default_region_{"AWS_DEFAULT_REGION", std::nullopt};
  EnvVar endpoint_{"AWS_ENDPOINT_URL", std::nullopt};
  EnvVar endpoint_s3_{"AWS_ENDPOINT_URL_S3", std::nullopt};
  EnvVar style_{"FLOWFEED_S3_ADDRESSING", std::nullopt};
};

TEST_F(S3Test, AGlobIsListedOverSeveralPagesAndEveryShardFetchedSigned) {
  write_shards(5, 50000, "bucket/data");
  write_shards(2, 10, "bucket/other");
  start(2);
  EnvVar endpoint_url("AWS_ENDPOINT_URL", endpoint());
  EnvVar key("AWS_ACCESS_KEY_ID", kKey);
  EnvVar secret("AWS_SECRET_ACCESS_KEY", kSecret);
  RemoteSource source{options(), nullptr};
  const auto paths = expand_file_set({"s3://bucket/data/train-*.tar"}, "shards", &source);
  ASSERT_EQ(paths.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(read_all(paths[i]), shard_bytes(i, 50000));
    EXPECT_EQ(source.files->url_of(paths[i]), "s3://bucket/data/" + name(i));
  }
  EXPECT_EQ(source.files->stats().bytes_fetched, 250000u);
  // Every request was signed for the region of the environment (the server refuses others).
  const std::string log = read_all(work_ + "/s3.log");
  EXPECT_NE(log.find("Credential=AKIDFLOWFEEDTEST/"), std::string::npos);
  EXPECT_NE(log.find("/eu-west-3/s3/aws4_request"), std::string::npos);
  EXPECT_NE(log.find("continuation-token="), std::string::npos);  // pages of 2 keys
  // Braces expand too, and a glob that matches nothing names the URL.
  RemoteSource braces{options(), nullptr};
  EXPECT_EQ(expand_file_set({"s3://bucket/data/train-{003..004}.tar"}, "shards", &braces).size(),
            2u);
  EXPECT_EQ(braces.files->stats().cache_hits, 2u);
  EXPECT_EQ(error_of<DataError>(
                [&] { expand_file_set({"s3://bucket/data/val-*.tar"}, "shards", &braces); }),
            "s3://bucket/data/val-*.tar: matches no object (the bucket lists 0 keys under "
            "'data/val-')");
}

TEST_F(S3Test, VirtualHostStyleAndProfileCredentials) {
  write_shards(2, 20000, "bucket/data");
  start();
  std::filesystem::create_directories(tmp_.file("home/.aws"));
  std::ofstream(tmp_.file("home/.aws/credentials"))
      << "[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n[loader]\n"
      << "aws_access_key_id = " << kKey << "\naws_secret_access_key = " << kSecret << "\n";
  std::ofstream(tmp_.file("home/.aws/config")) << "[profile loader]\nregion = ap-south-2\n";
  EnvVar profile("AWS_PROFILE", "loader");
  EnvVar region("AWS_REGION", std::nullopt);
  // bucket.localhost: curl connects to loopback for any *.localhost name.
  EnvVar endpoint_url("AWS_ENDPOINT_URL", endpoint("localhost"));
  EnvVar style("FLOWFEED_S3_ADDRESSING", "virtual");
  RemoteFiles files(options());
  const auto urls = files.list("s3://bucket/data/*.tar");
  ASSERT_EQ(urls.size(), 2u);
  const auto paths = files.fetch(urls);
  EXPECT_EQ(read_all(paths[1]), shard_bytes(1, 20000));
  const std::string log = read_all(work_ + "/s3.log");
  EXPECT_NE(log.find("GET /data/train-001.tar"), std::string::npos) << log;
  EXPECT_NE(log.find("/ap-south-2/s3/aws4_request"), std::string::npos);
}

TEST_F(S3Test, AWrongSecretIsA403NamingTheUrl) {
  write_shards(1, 100, "bucket/data");
  start();
  EnvVar endpoint_url("AWS_ENDPOINT_URL", endpoint());
  EnvVar key("AWS_ACCESS_KEY_ID", kKey);
  EnvVar secret("AWS_SECRET_ACCESS_KEY", "not-the-secret");
  RemoteFiles files(options());
  EXPECT_EQ(error_of<DataError>([&] { files.fetch({"s3://bucket/data/train-000.tar"}); }),
            "s3://bucket/data/train-000.tar: HTTP 403 Forbidden (access denied: check the "
            "credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE), the region and "
            "the bucket's policy)");
  EXPECT_EQ(error_of<DataError>([&] { files.list("s3://bucket/data/*.tar"); }),
            "s3://bucket/data/ (listing): HTTP 403 Forbidden (access denied: check the "
            "credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE), the region and "
            "the bucket's policy)");
  // A missing key is a 404 with its URL.
  EnvVar right("AWS_SECRET_ACCESS_KEY", kSecret);
  RemoteFiles again(options());
  EXPECT_EQ(error_of<DataError>([&] { again.fetch({"s3://bucket/data/train-009.tar"}); }),
            "s3://bucket/data/train-009.tar: HTTP 404 Not Found (no such object: check the URL "
            "(bucket, prefix and shard names))");
}

TEST_F(S3Test, ResetTransfersResumeWithASignedRange) {
  write_shards(3, 150000, "bucket/data");
  start();
  const std::string log = work_ + "/faults.log";
  auto proxy = python_server("fault_proxy.py", {"--upstream", std::to_string(server_->port()),
                                                "--first", "1", "--faults", "reset", "--log", log});
  EnvVar endpoint_url("AWS_ENDPOINT_URL", "http://127.0.0.1:" + std::to_string(proxy->port()));
  EnvVar key("AWS_ACCESS_KEY_ID", kKey);
  EnvVar secret("AWS_SECRET_ACCESS_KEY", kSecret);
  RemoteFiles files(options());
  const auto paths = files.fetch(files.list("s3://bucket/data/*.tar"));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(read_all(paths[i]), shard_bytes(i, 150000));
  // Each shard: half its body, a reset, then the rest asked for with Range (and signed: the
  // server refused nothing).
  EXPECT_LT(files.stats().bytes_fetched, 3u * 150000u + 3u * 150000u / 2u + 1u);
  EXPECT_GE(files.stats().retries, 3u);
  EXPECT_NE(read_all(work_ + "/s3.log").find("GET /bucket/data/train-000.tar"), std::string::npos);
}

TEST(SigV4, LibcurlSignsTheAwsS3GetObjectExample) {
  // Amazon S3 API reference, "Signature Calculations for the Authorization Header", example
  // GET Object: the published signature for these credentials, date, headers and request.
  testing_files::TempDir tmp;
  std::filesystem::create_directories(tmp.file("root"));
  const std::string log = tmp.file("s3.log");
  auto server = python_server(
      "s3_server.py", {"--root", tmp.file("root"), "--access-key", "AKIAIOSFODNN7EXAMPLE",
                       "--secret-key", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "--log", log});
  remote::S3Auth auth{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "",
                      "us-east-1"};
  RemoteOptions options;
  options.attempts = 1;
  remote::RetryCounters retries;
  remote::HttpClient client(options, retries);
  client.capture_headers();
  remote::Request request;
  request.url = "http://examplebucket.s3.amazonaws.com/test.txt";
  request.shown = request.url;
  request.auth = &auth;
  request.headers = {"Range: bytes=0-9",
                     "x-amz-content-sha256: "
                     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                     "x-amz-date: 20130524T000000Z"};
  request.connect_to =
      "examplebucket.s3.amazonaws.com:80:127.0.0.1:" + std::to_string(server->port());
  // The server checks the signature (then has no such bucket: 404, not 403).
  EXPECT_NE(error_of<DataError>([&] { client.get_text(request); }).find("HTTP 404"),
            std::string::npos);
  EXPECT_NE(client.sent_headers().find(
                "Authorization: AWS4-HMAC-SHA256 "
                "Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
                "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"),
            std::string::npos)
      << client.sent_headers();
}

}  // namespace
}  // namespace flowfeed::remote_test
