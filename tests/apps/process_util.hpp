#pragma once
/// \file
/// What the multi-process tests share: running a shell command (alone or under mpirun), reading
/// files and the `record` sink's files, and comparing trained weights.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/files.hpp"

namespace flowfeed::test {

/// Runs `command` with /bin/sh; returns its exit status (-1 if it did not exit) and, when asked,
/// what it printed on stdout.
inline int run_shell(const std::string& command, std::string* output = nullptr) {
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return -1;
  std::string out;
  std::array<char, 4096> buf;
  while (std::size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = pclose(pipe);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// Runs `command` (environment assignments may lead it) under a 120 s limit, stderr with stdout;
/// returns its exit status and, when asked, its output.
inline int run_shell_bounded(const std::string& command, std::string* output = nullptr) {
  return run_shell("timeout -k 5 120 env " + command + " 2>&1", output);
}

/// mpirun as CI runs it: as root, more ranks than cores, no shared-memory single copy (containers
/// often forbid the ptrace it needs). Put `-np N program ...` after it.
inline const std::string kMpirun =
    "OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 "
    "mpirun --allow-run-as-root --oversubscribe --bind-to none";

/// True when mpirun is installed (Debian: openmpi-bin); the MPI tests skip without it.
inline bool have_mpirun() {
  return std::system("command -v mpirun > /dev/null 2>&1") == 0;
}

/// max |a - b| over max |b| (and a failed expectation when the sizes differ).
inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

/// epoch -> batches (samples in visiting order), from a `record` sink's file.
using Record = std::map<int, std::vector<std::vector<unsigned>>>;

inline Record read_record(const std::string& path) {
  Record out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    int epoch;
    unsigned long long seq;
    ls >> epoch >> seq;
    std::vector<unsigned> batch;
    for (unsigned s; ls >> s;) batch.push_back(s);
    out[epoch].push_back(batch);
  }
  return out;
}

}  // namespace flowfeed::test
