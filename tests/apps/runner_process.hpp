#pragma once
/// \file
/// pipeline_runner in a child process, as a user meets it: its exit code and what it prints.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/apps/process_util.hpp"

namespace flowfeed::test {

using Clock = std::chrono::steady_clock;

/// Seconds a runner test waits for the child to end: far above what any of its runs needs, so
/// that only a hang fails.
inline constexpr double kExitBound = 60;

/// `name` in the test temp dir, unique to this process.
inline std::string runner_temp_path(const std::string& name) {
  return testing::TempDir() + "flowfeed_runner_" + std::to_string(getpid()) + "_" + name;
}

/// Writes `yaml` to runner_temp_path(name + ".yaml") and returns the path.
inline std::string write_config(const std::string& name, const std::string& yaml) {
  const std::string path = runner_temp_path(name + ".yaml");
  std::ofstream(path) << yaml;
  return path;
}

/// The runner in a child process, with its stdout and stderr captured.
class Runner {
 public:
  explicit Runner(std::vector<std::string> args) {
    args.insert(args.begin(), FLOWFEED_RUNNER);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int out[2], err[2];
    if (pipe(out) != 0 || pipe(err) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      close(out[0]);
      close(err[0]);
      close(out[1]);
      close(err[1]);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
    fcntl(out_fd_, F_SETFL, O_NONBLOCK);
    fcntl(err_fd_, F_SETFL, O_NONBLOCK);
  }
  ~Runner() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(out_fd_);
    close(err_fd_);
  }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  /// Waits until stderr contains `text`; false after `seconds`.
  bool wait_for_stderr(const std::string& text, double seconds) {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (err_.find(text) == std::string::npos) {
      if (Clock::now() > end || !pump(50)) return err_.find(text) != std::string::npos;
    }
    return true;
  }
  void signal(int sig) { kill(pid_, sig); }
  /// The child's process id (-1 once it was waited for).
  pid_t pid() const { return pid_; }
  /// Waits for the exit and returns the exit code; -1 (after killing it) when it has not exited
  /// within `seconds`, 1000 + N when it died of signal N.
  int wait(double seconds) {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      pump(20);
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        while (pump(0)) {
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
      }
      if (Clock::now() > end) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
        return -1;
      }
    }
  }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

 private:
  /// Reads what is available; false once both pipes are closed.
  bool pump(int timeout_ms) {
    pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    if (poll(fds, 2, timeout_ms) <= 0) return true;
    bool open = false;
    for (int i = 0; i < 2; ++i) {
      char buf[4096];
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) (i == 0 ? out_ : err_).append(buf, static_cast<std::size_t>(n));
      if (n != 0) open = true;
    }
    return open;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  std::string out_, err_;
};

/// The runner in a child process with its stdout and stderr in the file `log`: for runs that are
/// watched through the files they write and stopped with a signal.
class LoggedRunner {
 public:
  LoggedRunner(std::vector<std::string> args, const std::string& log) {
    args.insert(args.begin(), FLOWFEED_RUNNER);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~LoggedRunner() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  LoggedRunner(const LoggedRunner&) = delete;
  LoggedRunner& operator=(const LoggedRunner&) = delete;
  void signal(int sig) const { kill(pid_, sig); }
  /// The child's process id (-1 once it was waited for).
  pid_t pid() const { return pid_; }
  /// The exit code; -1 when it has not exited within 60 s (then it is killed).
  int wait() {
    const auto end = Clock::now() + std::chrono::seconds(60);
    for (;;) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
      }
      if (Clock::now() > end) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace flowfeed::test
