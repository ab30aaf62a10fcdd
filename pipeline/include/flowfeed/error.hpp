#pragma once
/// \file
/// The flowfeed error hierarchy. Every error's what() is the complete, user-facing message.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace flowfeed {

/// A position in a config file (1-based line and column), or an override given on the command line.
struct SourceLoc {
  std::string file;  ///< file name as given, "<string>" for in-memory YAML, "--set" for overrides
  int line = 0;      ///< 1-based; 0 when unknown
  int col = 0;       ///< 1-based; 0 when unknown

  /// "file:line:col", "file:line" or "file", whichever is known.
  std::string str() const;
};

/// Base of every flowfeed error.
class Error : public std::runtime_error {
 public:
  /// An error whose what() is `message`.
  using std::runtime_error::runtime_error;
};

/// A config (file, string, override or C++-built) is invalid. Holds every problem found, one per
/// line.
class ConfigError : public Error {
 public:
  /// At most this many problems are listed; a last line says how many more there were.
  static constexpr std::size_t kMaxListedProblems = 50;
  /// An error listing `problems` (the first kMaxListedProblems of them), then, when some were left
  /// out or `unlisted` > 0, "and K more problems (...)"; what() joins them with newlines.
  explicit ConfigError(std::vector<std::string> problems, std::size_t unlisted = 0);
  /// Each problem as `file:line:col: key.path: problem (why) fix`, as listed.
  const std::vector<std::string>& problems() const noexcept { return problems_; }

 private:
  struct Capped {};
  ConfigError(std::vector<std::string> problems, Capped);
  std::vector<std::string> problems_;
};

/// A data file is missing, unreadable or malformed. The message names the file and what is wrong.
class DataError : public Error {
 public:
  /// A data error whose what() is `message`.
  using Error::Error;
};

/// A node's body gave up because the run is being cancelled (another batch failed, a stop was
/// asked for): not a failure of its own. The error that cancelled the run is the run's error.
/// Also what a Pipeline's construction throws when interrupt_builds() cut its transfers short.
class RunCancelled : public Error {
 public:
  using Error::Error;
};

/// A CUDA runtime or library call failed. The message names the call.
class CudaError : public Error {
 public:
  /// A CUDA failure: `message` names the call, `code` is its status, `sticky` whether the context
  /// is lost.
  CudaError(const std::string& message, int code, bool sticky)
      : Error(message), code_(code), sticky_(sticky) {}
  /// The cudaError_t (or library status) value.
  int code() const noexcept { return code_; }
  /// True when the error poisons the CUDA context (e.g. a kernel fault): the process must not
  /// retry.
  bool sticky() const noexcept { return sticky_; }

 private:
  int code_;
  bool sticky_;
};

/// A node failed at run time. The message reads
/// `node 'upload' (cuda_upload, configs/x.yaml:21) batch 17 (epoch 0): <cause>`.
class NodeError : public Error {
 public:
  /// A failure of node `node` (of type `type`) on batch `batch` (-1: not in a batch).
  NodeError(const std::string& message, std::string node, std::string type, long long batch)
      : Error(message), node_(std::move(node)), type_(std::move(type)), batch_(batch) {}
  /// The failing node's name (`nodes[].name`).
  const std::string& node() const noexcept { return node_; }
  /// The failing node's type, as it ran (after `device:` resolution).
  const std::string& type() const noexcept { return type_; }
  /// Sequence number of the batch being processed, or -1 when the failure was not in a batch.
  long long batch() const noexcept { return batch_; }

 private:
  std::string node_;
  std::string type_;
  long long batch_;
};

}  // namespace flowfeed
