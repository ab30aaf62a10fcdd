// Where io_uring or O_DIRECT is unavailable, the npy loader logs it and reads with pread / through
// the page cache, or fails at build when io_fallback is false. The kernel refuses for real: each
// case runs in a child process under a seccomp filter (io_uring_setup → EPERM, as container
// runtimes' default profiles do; open with O_DIRECT → EINVAL, as file systems without direct I/O
// answer), and on tmpfs, which refuses O_DIRECT before Linux 6.6.
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "tests/nodes/npy_storage_fixture.hpp"

namespace flowfeed {
namespace {

using namespace testing_files;

enum class Refuse { io_uring, direct };

/// Installs a seccomp filter in this process that refuses io_uring_setup (EPERM) or an openat
/// that asks for O_DIRECT (EINVAL); every other call is allowed.
void refuse(Refuse what) {
  const auto flags_low = static_cast<std::uint32_t>(offsetof(seccomp_data, args[2]));
  std::vector<sock_filter> f = {BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr))};
  if (what == Refuse::io_uring) {
    f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1));
    f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM));
  } else {
    f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, 0, 3));
    f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, flags_low));
    f.push_back(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_DIRECT, 0, 1));
    f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL));
  }
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  sock_fprog program{static_cast<unsigned short>(f.size()), f.data()};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
    std::fprintf(stderr, "cannot install the seccomp filter\n");
    std::_Exit(2);
  }
}

class IoFallbackTest : public NpyStorageTest {
 protected:
  IoFallbackTest() { GTEST_FLAG_SET(death_test_style, "threadsafe"); }

  /// In the child: refuses `what`, runs the chain, prints each report warning and the engine's
  /// figures to stderr and exits 0 when every byte arrived.
  [[noreturn]] void run_refused(Refuse what, const std::string& io) {
    refuse(what);
    const RunReport report = run(chain(glob_params(io), "shuffle: true"));
    check_bytes();
    for (const std::string& w : report.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
    std::fprintf(stderr, "io_uring=%g direct_bytes=%g\n", extra(report, "load.io_uring"),
                 extra(report, "load.io_direct_bytes"));
    std::fflush(stderr);
    std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  /// In the child: refuses `what`, builds the chain and prints the error.
  [[noreturn]] void build_refused(Refuse what, const std::string& io) {
    refuse(what);
    std::fprintf(stderr, "error: %s\n", build_error(chain(glob_params(io))).c_str());
    std::fflush(stderr);
    std::_Exit(0);
  }
};

/// How a build error of the npy node starts, as a regex.
const std::string kNpyError = "error: node 'load' \\(npy, <string>:4\\): ";

TEST_F(IoFallbackTest, IoUringBlockedBySeccompFallsBackToPread) {
  write_shards({30}, 4096, 4096);
  EXPECT_EXIT(run_refused(Refuse::io_uring, ", io: io_uring"), ::testing::ExitedWithCode(0),
              "warning: node 'load': io_uring is unavailable \\(io_uring_queue_init: Operation "
              "not permitted\\); reading with pread\nio_uring=0 direct_bytes=0\n");
}

TEST_F(IoFallbackTest, IoUringBlockedWithoutFallbackFailsAtBuild) {
  write_shards({30}, 4096, 4096);
  EXPECT_EXIT(build_refused(Refuse::io_uring, ", io: io_uring, io_fallback: false"),
              ::testing::ExitedWithCode(0),
              kNpyError +
                  "io: io_uring is unavailable \\(io_uring_queue_init: Operation not permitted\\) "
                  "set io: pread, or io_fallback: true to fall back to it\n");
}

TEST_F(IoFallbackTest, ODirectRefusedReadsThroughThePageCache) {
  write_shards({30}, 4096, 4096);
  for (const char* io : {"pread", "io_uring"}) {
    SCOPED_TRACE(io);
    EXPECT_EXIT(run_refused(Refuse::direct, std::string(", direct: true, io: ") + io),
                ::testing::ExitedWithCode(0),
                "warning: node 'load': /[^\n]*/train-00.npy: O_DIRECT is unavailable \\(Invalid "
                "argument\\); reading it through the page cache\nio_uring=[01] direct_bytes=0\n");
  }
}

TEST_F(IoFallbackTest, ODirectRefusedWithoutFallbackFailsAtBuild) {
  write_shards({30}, 4096, 4096);
  const std::string why =
      "/[^\n]*/train-00.npy: cannot open with O_DIRECT \\(Invalid argument\\) set direct: false, "
      "or io_fallback: true to read it through the page cache\n";
  EXPECT_EXIT(build_refused(Refuse::direct, ", direct: true, io_fallback: false"),
              ::testing::ExitedWithCode(0), kNpyError + why);
}

/// On tmpfs: before Linux 6.6 it refuses O_DIRECT (the loader falls back, saying so); since then
/// it reads direct. Either way every byte arrives.
class TmpfsTest : public NpyStorageTest {
 protected:
  TmpfsTest() : NpyStorageTest("/dev/shm") {}
};

TEST_F(TmpfsTest, DirectReadsOnTmpfsArriveWhetherOrNotTheKernelAllowsThem) {
  write_shards({30}, 4096, 4096);
  const int fd = ::open(dir_.file("train-00.npy").c_str(), O_RDONLY | O_DIRECT);
  const bool refused = fd < 0 && errno == EINVAL;
  if (fd >= 0) ::close(fd);
  const RunReport report = run(chain(glob_params(", direct: true, io: io_uring"), "shuffle: true"));
  EXPECT_EQ(check_bytes().size(), 60u);
  if (refused) {
    ASSERT_EQ(report.warnings.size(), 1u);
    EXPECT_EQ(report.warnings[0], "node 'load': " + dir_.file("train-00.npy") +
                                      ": O_DIRECT is unavailable (Invalid argument); reading it "
                                      "through the page cache");
    EXPECT_EQ(extra(report, "load.io_direct_bytes"), 0.0);
  } else {
    EXPECT_TRUE(report.warnings.empty());
    EXPECT_EQ(extra(report, "load.io_direct_bytes"), 60.0 * 4096);
  }
}

}  // namespace
}  // namespace flowfeed
