#pragma once
/// \file
/// What the multi-process tests share: running a shell command and reading the `record` sink's
/// files.

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

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
