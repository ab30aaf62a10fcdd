// Shards over HTTP from nginx on 127.0.0.1: fetched byte for byte into the cache, reused warm,
// the byte budget never exceeded, concurrent runs sharing one cache, foreign files refused,
// faults retried and resumed, and failures named with their URL and status.
#include "flowfeed/remote/remote_files.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <set>

#include "checksums.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/nodes/detail/file_set.hpp"
#include "http_body.hpp"
#include "shard_cache.hpp"
#include "tests/error_of.hpp"
#include "tests/remote/remote_fixture.hpp"

namespace flowfeed::remote_test {
namespace {

using flowfeed::test::error_of;

TEST_F(RemoteTest, BracesFetchEveryShardByteForByteThenTheCacheIsWarm) {
  write_shards(5, 100000);
  Nginx nginx(served_, work_ + "/nginx");
  const std::string pattern = nginx.url("data/train-{000..004}.tar");
  {
    RemoteSource source{options(), nullptr};
    const std::vector<std::string> paths = expand_file_set({pattern}, "shards", &source);
    ASSERT_EQ(paths.size(), 5u);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(read_all(paths[i]), shard_bytes(i, 100000)) << paths[i];
      EXPECT_EQ(source.files->url_of(paths[i]), nginx.url("data/" + name(i)));
    }
    const RemoteStats& s = source.files->stats();
    EXPECT_EQ(s.shards, 5u);
    EXPECT_EQ(s.cache_hits, 0u);
    EXPECT_EQ(s.bytes_fetched, 500000u);
    EXPECT_EQ(s.retries, 0u);
    EXPECT_EQ(s.retry_seconds, 0.0);
  }
  // A later run: every shard from the cache, nothing over the network.
  RemoteSource source{options(), nullptr};
  const std::vector<std::string> paths = expand_file_set({pattern}, "shards", &source);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(read_all(paths[i]), shard_bytes(i, 100000));
  EXPECT_EQ(source.files->stats().cache_hits, 5u);
  EXPECT_EQ(source.files->stats().bytes_fetched, 0u);
  // The cache holds the shards, its lock and its marker: no temporary file is left.
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(cache_)) {
    names.insert(e.path().filename().string());
  }
  EXPECT_EQ(names.size(), 7u);
  for (const std::string& n : names) EXPECT_EQ(n.find(".part"), std::string::npos) << n;
}

TEST_F(RemoteTest, AMissingShardIsADataErrorWithItsUrlAndStatus) {
  write_shards(1, 1000);
  Nginx nginx(served_, work_ + "/nginx");
  const std::string url = nginx.url("data/train-{000..001}.tar");
  RemoteSource source{options(), nullptr};
  // The first shard is there; the second is not: its HEAD answers 404.
  EXPECT_EQ(error_of<DataError>([&] { expand_file_set({url}, "shards", &source); }),
            nginx.url("data/train-001.tar") +
                ": HTTP 404 Not Found (no such object: check the URL (bucket, prefix and shard "
                "names))");
  // A wrong first shard fails before any transfer.
  RemoteSource other{options(), nullptr};
  EXPECT_EQ(
      error_of<DataError>([&] { expand_file_set({nginx.url("nope.tar")}, "shards", &other); }),
      nginx.url("nope.tar") +
          ": HTTP 404 Not Found (no such object: check the URL (bucket, prefix and shard "
          "names))");
}

// URLs that cannot be fetched are refused before any request, each with its reason.
TEST_F(RemoteTest, MalformedUrlsAndHttpGlobsAreRefusedWithTheReason) {
  RemoteFiles files(options());
  EXPECT_EQ(error_of<DataError>([&] { files.list("https://host/data/train-*.tar"); }),
            "https://host/data/train-*.tar: a glob needs a listing, which only s3:// URLs have "
            "(name the shards with braces, e.g. train-{000..099}.tar)");
  EXPECT_EQ(error_of<DataError>([&] { files.list("http://user:pw@host/x.tar"); }),
            "http://user:pw@host/x.tar: not a URL flowfeed can fetch (credentials in a URL are "
            "not accepted; S3 takes them from the AWS environment)");
  EXPECT_EQ(error_of<DataError>([&] { files.list("http://host:http/x.tar"); }),
            "http://host:http/x.tar: not a URL flowfeed can fetch (the port is not a number)");
  EXPECT_EQ(error_of<DataError>([&] { files.list("s3://bucket"); }),
            "s3://bucket: not a URL flowfeed can fetch (no key after the bucket)");
  EXPECT_EQ(error_of<DataError>([&] { files.list("https:///x.tar"); }),
            "https:///x.tar: not a URL flowfeed can fetch (no host)");
  EXPECT_EQ(error_of<DataError>([&] { files.list("https://host/x.tar?version=2"); }),
            "https://host/x.tar?version=2: not a URL flowfeed can fetch (a query or fragment is "
            "not a shard)");
}

TEST_F(RemoteTest, AServerThatIsNotThereFailsAfterTheAttempts) {
  const int port = free_port();
  RemoteOptions o = options();
  o.attempts = 2;
  RemoteFiles files(o);
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/x.tar";
  const std::string message = error_of<DataError>([&] { files.fetch({url}); });
  EXPECT_EQ(message.rfind(url + ": ", 0), 0u) << message;
  EXPECT_NE(message.find("(curl error 7) after 2 attempts (check the host and port, and that the "
                         "server is up)"),
            std::string::npos)
      << message;
}

TEST_F(RemoteTest, TheByteBudgetIsNeverExceeded) {
  write_shards(8, 40000);
  Nginx nginx(served_, work_ + "/nginx");
  RemoteOptions o = options();
  o.cache_bytes = 100000;  // two shards and a half
  std::uint64_t evicted = 0;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 8; ++i) {
      RemoteFiles files(o);  // one shard in use at a time: older ones may go
      const auto paths = files.fetch({nginx.url("data/" + name(i))});
      EXPECT_EQ(read_all(paths[0]), shard_bytes(i, 40000));
      EXPECT_LE(files.stats().peak_cache_bytes, o.cache_bytes);
      EXPECT_LE(dir_bytes(cache_) - std::filesystem::file_size(cache_ + "/.flowfeed-cache"),
                o.cache_bytes);
      evicted += files.stats().evicted_bytes;
    }
  }
  EXPECT_GE(evicted, 14u * 40000u);  // 16 fetches, at most 2 shards kept
  // Three shards in use at once cannot fit: the third is refused, nothing is evicted under a
  // reader, and the budget still holds.
  RemoteFiles files(o);
  std::vector<std::string> urls;
  for (int i = 0; i < 3; ++i) urls.push_back(nginx.url("data/" + name(i)));
  const std::string message = error_of<DataError>([&] { files.fetch(urls); });
  EXPECT_NE(message.find(": no room in the cache " + cache_ +
                         " for the shard's 40000 bytes: 80000 "
                         "of its cache_bytes (100000) are shards that this or another run is "
                         "using raise cache_bytes, or run fewer loaders on this cache at once"),
            std::string::npos)
      << message;
  // A shard larger than the whole budget.
  o.cache_bytes = 1000;
  o.cache_dir = cache_ + "-small";
  RemoteFiles small(o);
  EXPECT_EQ(error_of<DataError>([&] { small.fetch({urls[0]}); }),
            urls[0] +
                ": the shard's 40000 bytes are more than the cache's cache_bytes (1000) "
                "raise the loader's cache_bytes");
}

// A cache filled under a larger budget shrinks to the budget of the run that opens it: the least
// recently used shards go first.
TEST_F(RemoteTest, ACacheOpenedWithASmallerBudgetShrinksToIt) {
  write_shards(4, 30000);
  Nginx nginx(served_, work_ + "/nginx");
  std::vector<std::string> urls;
  for (int i = 0; i < 4; ++i) urls.push_back(nginx.url("data/" + name(i)));
  RemoteOptions one_at_a_time = options();
  one_at_a_time.transfers = 1;  // cached in order 0, 1, 2, 3: the order of their last use
  {
    RemoteFiles files(one_at_a_time);
    files.fetch(urls);
  }
  {
    RemoteFiles files(options());
    files.fetch({urls[0]});
  }  // shard 0: the most recently used
  RemoteOptions o = options();
  o.cache_bytes = 65000;  // two shards
  RemoteFiles files(o);
  EXPECT_EQ(files.stats().evicted_bytes, 60000u);
  EXPECT_LE(dir_bytes(cache_) - std::filesystem::file_size(cache_ + "/.flowfeed-cache"),
            o.cache_bytes);
  files.fetch({urls[0], urls[3]});
  EXPECT_EQ(files.stats().cache_hits, 2u);  // shards 0 and 3 were kept
}

TEST_F(RemoteTest, ACacheDirectoryWithForeignFilesIsRefused) {
  std::filesystem::create_directories(cache_);
  std::ofstream(cache_ + "/notes.txt") << "mine";
  EXPECT_EQ(error_of<ConfigError>([&] { RemoteFiles files(options()); }),
            cache_ +
                ": holds 'notes.txt', which flowfeed did not write (flowfeed removes files "
                "in its cache, and never one it did not write) give cache_dir an empty or "
                "new directory");
  EXPECT_EQ(read_all(cache_ + "/notes.txt"), "mine");
  // An existing cache with a stranger in it is refused too.
  std::filesystem::remove(cache_ + "/notes.txt");
  { RemoteFiles files(options()); }
  std::ofstream(cache_ + "/train-000.tar") << "x";
  EXPECT_NE(error_of<ConfigError>([&] { RemoteFiles files(options()); }).find("'train-000.tar'"),
            std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(cache_ + "/train-000.tar"));
}

// Runs (ranks on one machine) that open one new cache directory at the same moment all open it:
// the marker and lock another of them has just written are not files flowfeed did not write.
TEST_F(RemoteTest, RunsOpeningOneNewCacheDirectoryAtOnceAllOpenIt) {
  constexpr int kRounds = 30;
  constexpr int kRuns = 6;
  for (int round = 0; round < kRounds; ++round) {
    RemoteOptions o = options();
    o.cache_dir = cache_ + "-" + std::to_string(round);
    int pipes[kRuns][2];
    pid_t pids[kRuns];
    int go[2];  // every run starts when the parent closes it: all at once
    ASSERT_EQ(::pipe(go), 0);
    for (int r = 0; r < kRuns; ++r) {
      ASSERT_EQ(::pipe(pipes[r]), 0);
      pids[r] = ::fork();
      if (pids[r] == 0) {
        ::close(go[1]);
        char c;
        (void)!::read(go[0], &c, 1);
        std::string why = "ok";
        try {
          RemoteFiles files(o);
        } catch (const std::exception& e) {
          why = e.what();
        }
        (void)!::write(pipes[r][1], why.data(), why.size());
        ::_exit(0);
      }
      ::close(pipes[r][1]);
    }
    ::close(go[0]);
    ::close(go[1]);
    for (int r = 0; r < kRuns; ++r) {
      int status = 0;
      ASSERT_EQ(::waitpid(pids[r], &status, 0), pids[r]);
      char buf[1024] = {0};
      ASSERT_GT(::read(pipes[r][0], buf, sizeof buf - 1), 0);
      ::close(pipes[r][0]);
      ASSERT_EQ(std::string(buf), "ok") << "round " << round << " run " << r;
    }
  }
}

TEST_F(RemoteTest, TwoRunsShareOneCacheAndFetchEachShardOnce) {
  write_shards(6, 300000);
  Nginx nginx(served_, work_ + "/nginx");
  // The proxy slows every body so that the two runs overlap.
  auto proxy =
      python_server("fault_proxy.py", {"--upstream", std::to_string(nginx.port()), "--rate", "1",
                                       "--faults", "slow", "--slow-s", "0.05"});
  std::vector<std::string> urls;
  for (int i = 0; i < 6; ++i) {
    urls.push_back("http://127.0.0.1:" + std::to_string(proxy->port()) + "/data/" + name(i));
  }
  int pipes[2][2];
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(::pipe(pipes[r]), 0);
    pids[r] = ::fork();
    if (pids[r] == 0) {
      int ok = 0;
      std::uint64_t fetched = 0;
      std::string why = "-";
      try {
        RemoteOptions o = options();
        o.transfers = 3;
        RemoteFiles files(o);
        const auto paths = files.fetch(urls);
        ok = 1;
        for (int i = 0; i < 6; ++i) ok &= read_all(paths[i]) == shard_bytes(i, 300000) ? 1 : 0;
        fetched = files.stats().bytes_fetched;
      } catch (const std::exception& e) {
        ok = 0;
        why = e.what();
      }
      const std::string line = std::to_string(ok) + " " + std::to_string(fetched) + " " + why;
      (void)!::write(pipes[r][1], line.data(), line.size());
      ::_exit(0);
    }
    ::close(pipes[r][1]);
  }
  std::uint64_t total = 0;
  for (int r = 0; r < 2; ++r) {
    int status = 0;
    ASSERT_EQ(::waitpid(pids[r], &status, 0), pids[r]);
    char buf[4096] = {0};
    ASSERT_GT(::read(pipes[r][0], buf, sizeof buf - 1), 0);
    ::close(pipes[r][0]);
    int ok = 0;
    unsigned long long fetched = 0;
    ASSERT_EQ(std::sscanf(buf, "%d %llu", &ok, &fetched), 2);
    EXPECT_EQ(ok, 1) << "run " << r << ": " << buf;
    total += fetched;
  }
  // Each shard crossed the network once: the second run waited for the first's transfer.
  EXPECT_EQ(total, 6u * 300000u);
}

TEST_F(RemoteTest, FaultsAreRetriedAndAResetTransferResumesWithARange) {
  write_shards(4, 200000);
  Nginx nginx(served_, work_ + "/nginx");
  const std::string log = work_ + "/faults.log";
  // The first GET of every path fails: 503, 429, a reset half-way through the body, a slow
  // body, in turn.
  auto proxy = python_server(
      "fault_proxy.py", {"--upstream", std::to_string(nginx.port()), "--first", "1", "--faults",
                         "503,429,reset,slow", "--methods", "GET", "--log", log});
  RemoteFiles files(options());
  std::vector<std::string> urls;
  for (int i = 0; i < 4; ++i) {
    urls.push_back("http://127.0.0.1:" + std::to_string(proxy->port()) + "/data/" + name(i));
  }
  const auto paths = files.fetch(urls);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(read_all(paths[i]), shard_bytes(i, 200000));
  EXPECT_EQ(files.stats().cache_hits, 0u);
  EXPECT_EQ(files.stats().retries, 3u);  // 503, 429 and the reset; a slow body just takes longer
  // The bytes before the reset were kept: the retry asked for the rest only.
  EXPECT_EQ(files.stats().bytes_fetched, 4u * 200000u);
  const std::string faults = read_all(log);
  EXPECT_NE(faults.find("reset GET /data/train-"), std::string::npos) << faults;
}

// A connection dropped part-way through a body is resumed at once, with a Range request for the
// rest, and does not spend the attempts: a large shard over a flaky connection finishes as long as
// each try brings bytes.
TEST_F(RemoteTest, ATransferCutOffAfterSomeBytesResumesAtOnceWithoutSpendingTheAttempts) {
  write_shards(1, 1000000);
  Nginx nginx(served_, work_ + "/nginx");
  auto proxy = fault_proxy(nginx, {"--first", "6", "--faults", "reset", "--methods", "GET"});
  RemoteOptions o = options();
  o.attempts = 2;
  o.backoff_s = 1;  // a wait between the tries would show in the time
  o.max_backoff_s = 1;
  RemoteFiles files(o);
  const std::string url = base_url(*proxy) + "data/" + name(0);
  const auto start = std::chrono::steady_clock::now();
  const auto paths = files.fetch({url});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(read_all(paths[0]), shard_bytes(0, 1000000));
  EXPECT_EQ(files.stats().retries, 6u);
  EXPECT_EQ(files.stats().bytes_fetched, 1000000u);  // each try asked only for the rest
  EXPECT_LT(seconds, 2.5);                           // six waits of 0.5 s or more would take 3 s
  EXPECT_EQ(files.stats().retry_seconds, 0.0);       // no try was lost, none waited
}

// A ranged read answered with other bytes than asked for (its Content-Range says so) is refused.
TEST_F(RemoteTest, ARangeAnsweredWithAnotherContentRangeIsRefused) {
  write_shards(1, 1000);
  Nginx nginx(served_, work_ + "/nginx");
  auto proxy = fault_proxy(nginx, {"--rate", "1", "--faults", "badrange", "--methods", "GET"});
  RemoteFiles files(options());
  const std::string url = base_url(*proxy) + "data/" + name(0);
  std::vector<std::byte> dst(100);
  EXPECT_EQ(error_of<DataError>([&] { files.read_range(url, 200, 100, dst.data()); }),
            url + ": asked for bytes 200-299, the server's Content-Range says 'bytes 201-300'");
}

// read_ranges() runs a call's reads at once (up to `transfers`): sixteen ranges answered 0.3 s
// late each take about one delay with 8 transfers, not sixteen; every byte lands where its read
// says; and of two failing reads, the first in the order given is the error, whichever ended first.
TEST_F(RemoteTest, RangeReadsOfACallRunAtOnceAndTheFirstFailureInOrderIsTheError) {
  write_shards(2, 100000);
  Nginx nginx(served_, work_ + "/nginx");
  auto proxy = fault_proxy(nginx, {"--delay", "0.3"});
  RemoteOptions o = options();
  o.transfers = 8;
  RemoteFiles files(o);
  const std::string urls[2] = {base_url(*proxy) + "data/" + name(0),
                               base_url(*proxy) + "data/" + name(1)};
  std::vector<std::byte> dst(16 * 1000);
  std::vector<RangeRead> reads;
  for (std::size_t i = 0; i < 16; ++i) {
    reads.push_back(RangeRead{&urls[i % 2], 5000 * i + 7, 1000, dst.data() + 1000 * (15 - i)});
  }
  const auto start = std::chrono::steady_clock::now();
  files.read_ranges(reads.data(), reads.size());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 1.5);  // 16 one after another: 4.8 s; 8 at once: 2 × 0.3 s
  for (std::size_t i = 0; i < 16; ++i) {
    const std::string want =
        shard_bytes(static_cast<int>(i % 2), 100000).substr(5000 * i + 7, 1000);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(dst.data()) + 1000 * (15 - i), 1000), want)
        << "read " << i;
  }
  EXPECT_EQ(files.stats().range_reads, 16u);
  const std::string missing[2] = {nginx.url("data/gone-1.npy"), nginx.url("data/gone-2.npy")};
  reads[3].url = &missing[0];
  reads[1].url = &missing[1];
  EXPECT_EQ(error_of<DataError>([&] { files.read_ranges(reads.data(), reads.size()); }),
            missing[1] +
                ": HTTP 404 Not Found (no such object: check the URL (bucket, prefix and "
                "shard names))");
}

// A body reaches its file in writes that end at 2 MiB multiples of the file, whatever pieces
// curl hands over and wherever a resumed transfer starts: the file grows by whole aligned pieces
// while the body arrives, and the rest is written at the end of the try.
TEST_F(RemoteTest, ABodyIsWrittenInPiecesEndingAt2MiBMultiples) {
  const std::string path = work_ + "/body";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  const std::uint64_t start = 3 * (std::uint64_t{1} << 20) - 5;  // a resume part way in
  const std::uint64_t mib = std::uint64_t{1} << 20;
  std::vector<char> pending;
  pending.reserve(remote::kBodyWriteAlign);
  remote::Sink sink{.fd = fd,
                    .start = start,
                    .offset = start,
                    .limit = 8 * mib,
                    .checked = true,
                    .to_file = true,
                    .pending = &pending};
  auto size = [&] {
    struct stat st {};
    ::fstat(fd, &st);
    return static_cast<std::uint64_t>(st.st_size);
  };
  std::vector<char> piece(16381);  // curl's pieces need not divide anything
  std::uint64_t sent = 0;
  std::vector<std::uint64_t> sizes;  // the file's size after each piece, when it changed
  while (sent + piece.size() <= 5 * mib) {
    for (std::size_t i = 0; i < piece.size(); ++i) {
      piece[i] = static_cast<char>((start + sent + i) % 251);
    }
    ASSERT_EQ(remote::write_body(piece.data(), 1, piece.size(), &sink), piece.size());
    sent += piece.size();
    if (sizes.empty() || sizes.back() != size()) sizes.push_back(size());
  }
  EXPECT_EQ(sizes, (std::vector<std::uint64_t>{0, 4 * mib, 6 * mib}));
  EXPECT_EQ(pending.capacity(), remote::kBodyWriteAlign);  // never grown past one piece
  ASSERT_TRUE(remote::flush(sink));                        // the end of the try
  EXPECT_EQ(size(), start + sent);
  std::string bytes(sent, '\0');
  ASSERT_EQ(::pread(fd, bytes.data(), sent, static_cast<off_t>(start)), static_cast<ssize_t>(sent));
  for (std::uint64_t i = 0; i < sent; i += 4093) {
    ASSERT_EQ(bytes[i], static_cast<char>((start + i) % 251)) << i;
  }
  ::close(fd);
}

// A cache on a device without room for the shard fails the fetch before a byte is transferred,
// naming the URL, the cache and the size, and leaves no partial copy behind. The device: a
// 1 MiB tmpfs, mounted in a mount namespace of this test's process only (skipped where the
// process may not make one).
TEST_F(RemoteTest, ACacheWithoutRoomForTheShardFailsBeforeTheTransfer) {
  if (::unshare(CLONE_NEWNS) != 0 ||
      ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    GTEST_SKIP() << "cannot make a mount namespace here: " << std::strerror(errno);
  }
  std::filesystem::create_directories(cache_);
  if (::mount("tmpfs", cache_.c_str(), "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount(dir.c_str()); }
  } unmount{cache_};
  write_shards(1, 2000000);
  Nginx nginx(served_, work_ + "/nginx");
  RemoteFiles files(options());
  const std::string url = nginx.url("data/" + name(0));
  EXPECT_EQ(error_of<DataError>([&] { files.fetch({url}); }),
            url + ": no space left on the device of the cache " + cache_ +
                " for the shard's 2000000 bytes (free some, or set the loader's cache_dir "
                "elsewhere)");
  EXPECT_EQ(files.stats().bytes_fetched, 0u);
  for (const auto& e : std::filesystem::directory_iterator(cache_)) {  // no partial copy
    EXPECT_EQ(e.path().filename().string().find(name(0)), std::string::npos) << e.path();
  }
}

TEST_F(RemoteTest, RetriesSpentAreADataErrorWithTheLastStatus) {
  write_shards(1, 1000);
  Nginx nginx(served_, work_ + "/nginx");
  auto proxy = python_server("fault_proxy.py", {"--upstream", std::to_string(nginx.port()),
                                                "--first", "100", "--faults", "503"});
  RemoteOptions o = options();
  o.attempts = 3;
  o.backoff_s = 0.4;
  o.max_backoff_s = 1;
  RemoteFiles files(o);
  const std::string url = "http://127.0.0.1:" + std::to_string(proxy->port()) + "/data/" + name(0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(error_of<DataError>([&] { files.fetch({url}); }),
            url +
                ": HTTP 503 Service Unavailable after 3 attempts (the server kept failing: try "
                "later, or raise the loader's attempts)");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(files.stats().retries, 2u);
  // Two lost tries and their waits (0.2–0.4 s, then 0.4–0.8 s) are what the faults cost; the
  // third try, which ended the fetch, is not counted.
  EXPECT_GE(files.stats().retry_seconds, 0.6);
  EXPECT_LE(files.stats().retry_seconds, seconds);
}

// A shard another run holds for fetching but does not fetch (a stopped process) is not waited
// for without end: once its transfer has not grown for 2 × timeout_s + the longest backoff, the
// fetch is a DataError that says so.
TEST_F(RemoteTest, AnotherRunsStalledTransferIsNotWaitedForWithoutEnd) {
  write_shards(1, 100000);
  Nginx nginx(served_, work_ + "/nginx");
  const std::string url = nginx.url("data/" + name(0));
  RemoteOptions o = options();
  o.timeout_s = 1;
  { RemoteFiles files(o); }  // makes the cache
  const std::string stem = remote::ShardCache::entry_name(url);
  const std::string part = cache_ + "/" + stem.substr(0, stem.size() - 6) + ".100000.part";
  std::ofstream(part, std::ios::binary) << shard_bytes(0, 100000).substr(0, 7);
  const int held = ::open(part.c_str(), O_RDWR);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);  // as a live transfer of another run holds it
  RemoteFiles files(o);
  EXPECT_EQ(error_of<DataError>([&] { files.fetch({url}); }),
            url + ": another run (or rank) is fetching this shard into " + cache_ +
                " but its transfer has not grown for 2.05 s (stopped? it holds " + part +
                ") end that run, or use another cache_dir");
  ::close(held);
  // Once that run is gone, its part is resumed.
  const auto paths = files.fetch({url});
  EXPECT_EQ(read_all(paths[0]), shard_bytes(0, 100000));
  EXPECT_EQ(files.stats().bytes_fetched, 100000u - 7u);
}

TEST_F(RemoteTest, APartLeftByADeadRunIsResumed) {
  write_shards(1, 100000);
  Nginx nginx(served_, work_ + "/nginx");
  const std::string url = nginx.url("data/" + name(0));
  { RemoteFiles files(options()); }  // makes the cache
  // What a run killed mid-transfer leaves: the first 30000 bytes under the temporary name.
  const std::string stem = remote::ShardCache::entry_name(url);
  const std::string part = cache_ + "/" + stem.substr(0, stem.size() - 6) + ".100000.part";
  std::ofstream(part, std::ios::binary) << shard_bytes(0, 100000).substr(0, 30000);
  RemoteFiles files(options());
  const auto paths = files.fetch({url});
  EXPECT_EQ(read_all(paths[0]), shard_bytes(0, 100000));
  EXPECT_EQ(files.stats().bytes_fetched, 70000u);
  EXPECT_FALSE(std::filesystem::exists(part));
}

// A shard a checksum manifest names is verified before it enters the cache: a wrong sum is a
// DataError naming the URL and both sums, and nothing of that shard is kept.
TEST_F(RemoteTest, AShardWhoseSha256DiffersFromTheManifestIsNotUsed) {
  write_shards(3, 50000);
  Nginx nginx(served_, work_ + "/nginx");
  auto hex = [](const std::string& bytes) {
    const std::string file = std::string(::testing::TempDir()) + "/remote_sha_input";
    std::ofstream(file, std::ios::binary) << bytes;
    const int fd = ::open(file.c_str(), O_RDONLY);
    const std::string sum = remote::sha256_of(fd, file);
    ::close(fd);
    return sum;
  };
  // sha256sum's form: the file name (or the key, or the whole URL); shard 2's sum is of other
  // bytes.
  const std::string manifest = work_ + "/SHA256SUMS";
  std::ofstream(manifest) << hex(shard_bytes(0, 50000)) << "  " << name(0) << "\n"
                          << hex(shard_bytes(1, 50000)) << " *data/" << name(1) << "\n"
                          << hex(shard_bytes(9, 50000)) << "  " << name(2) << "\n";
  RemoteOptions o = options();
  o.checksums = manifest;
  RemoteFiles files(o);
  const auto paths = files.fetch({nginx.url("data/" + name(0)), nginx.url("data/" + name(1))});
  EXPECT_EQ(read_all(paths[1]), shard_bytes(1, 50000));
  const std::string url = nginx.url("data/" + name(2));
  EXPECT_EQ(error_of<DataError>([&] { files.fetch({url}); }),
            url + ": its SHA-256 is " + hex(shard_bytes(2, 50000)) +
                ", the checksum manifest says " + hex(shard_bytes(9, 50000)) +
                " (the shard was damaged or changed; it is not used)");
  const std::string stem = remote::ShardCache::entry_name(url);
  for (const auto& e : std::filesystem::directory_iterator(cache_)) {
    EXPECT_NE(e.path().filename().string().rfind(stem.substr(0, 16), 0), 0u) << e.path();
  }
  // A manifest line that is not a sum is named with its line.
  std::ofstream(manifest, std::ios::app) << "not a sum\n";
  RemoteFiles bad(o);
  EXPECT_EQ(error_of<DataError>([&] { bad.fetch({url}); }),
            manifest + ":4: not a SHA-256 line ('<64 hex digits>  <name>', as sha256sum writes)");
}

}  // namespace
}  // namespace flowfeed::remote_test
