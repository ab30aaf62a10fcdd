// A checkpoint directory held for writing (checkpoint.hpp): which files in it are flowfeed's own,
// the lock that keeps a second writer out, and the write of a generation that removes only what
// flowfeed listed.

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "detail/checkpoint_files.hpp"
#include "flowfeed/checkpoint.hpp"
#include "flowfeed/error.hpp"

namespace flowfeed {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr const char* kFilesFormat = "flowfeed checkpoint files";
constexpr const char* kLockHeader = "flowfeed checkpoint lock\n";
constexpr const char* kOwnDirectory = "give --checkpoint an empty or new directory";

[[noreturn]] void write_failed(const std::string& path, const char* what, int error) {
  throw Error(fmt::format("checkpoint: cannot {} {} ({})", what, path, std::strerror(error)));
}

[[noreturn]] void refuse(const std::string& dir, const std::string& problem) {
  throw ConfigError({fmt::format("{}: {}", dir, problem)});
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) write_failed(dir, "open the directory", errno);
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0) write_failed(dir, "flush the directory", error);
}

/// Up to 256 bytes of the file at `path` ("" when it cannot be read).
std::string head_of(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return "";
  struct stat st;
  std::string text(256, '\0');
  ssize_t n = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) n = ::read(fd, text.data(), text.size());
  ::close(fd);
  text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  return text;
}

/// The pid a lock file names ("" when none).
std::string lock_holder(const std::string& lock) {
  const std::string text = head_of(lock);
  const std::size_t at = text.find("pid ");
  if (at == std::string::npos) return "";
  const std::size_t end = text.find_first_not_of("0123456789", at + 4);
  return text.substr(at + 4, end == std::string::npos ? std::string::npos : end - at - 4);
}

/// Whether `lock` is a lock file flowfeed made: a regular file, empty or with the header.
bool own_lock(const fs::path& lock) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(lock, ec))) return false;
  const std::string head = head_of(lock.string());
  return head.empty() || head.rfind(kLockHeader, 0) == 0;
}

/// What a directory holds of a checkpoint of ours: the node files it may remove and the
/// generation of its manifest. Refuses (ConfigError) a directory with any other entry.
struct Contents {
  std::uint64_t generation = 0;
  std::set<std::string> listed;
};

/// A JSON file of ours in `dir` (the manifest or the file list): its object, or a refusal naming
/// it when it is not one flowfeed wrote.
json read_own_json(const std::string& dir, const std::string& name, const char* format,
                   const char* noun) {
  const std::string path = (fs::path(dir) / name).string();
  // A device, FIFO, directory or oversized file of that name is not one flowfeed wrote either.
  std::string text;
  try {
    text = detail::read_checkpoint_file(path, kMaxManifestBytes, noun);
  } catch (const ConfigError&) {
    text.clear();
  }
  const json j = detail::json_nesting(text) > detail::kMaxCheckpointNesting
                     ? json(json::value_t::discarded)
                     : json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("format") || j["format"] != format) {
    refuse(dir, fmt::format("holds {}, which is not a {} flowfeed wrote (--checkpoint removes "
                            "the files of its older checkpoints, so it takes only a directory of "
                            "its own) {}",
                            name, noun, kOwnDirectory));
  }
  return j;
}

/// The node file names in `list` (a JSON array): NAME.GENERATION.bin or its temporary file, never
/// a name flowfeed gives another file here. Anything else makes `dir` not ours.
void add_names(const std::string& dir, const json& list, const std::string& from,
               std::set<std::string>& out) {
  const auto corrupt = [&](const std::string& what) {
    refuse(dir, fmt::format("{}: {} (node files are NAME.GENERATION.bin; the file is corrupt) {}",
                            from, what, kOwnDirectory));
  };
  if (!list.is_array()) corrupt("the list of node files is not a list");
  for (const json& f : list) {
    if (!f.is_string()) corrupt(fmt::format("an entry is a {}, not a file name", f.type_name()));
    const std::string name = f.get<std::string>();
    const bool node_file = name.ends_with(".bin") || name.ends_with(".bin.tmp");
    if (!node_file || name.size() > 255 || name.find('/') != std::string::npos ||
        name.rfind(kCheckpointManifest, 0) == 0 || name.rfind(kCheckpointFiles, 0) == 0 ||
        name.rfind(kCheckpointLock, 0) == 0) {
      corrupt(fmt::format("'{}' is not a node file", name.substr(0, 60)));
    }
    out.insert(name);
  }
}

Contents scan(const std::string& dir) {
  Contents c;
  std::error_code ec;
  const fs::path root(dir);
  const bool lock_ours = own_lock(root / kCheckpointLock);
  bool own_json = false;
  if (fs::exists(root / kCheckpointManifest, ec)) {
    const json m =
        read_own_json(dir, kCheckpointManifest, "flowfeed checkpoint", "checkpoint manifest");
    if (m.contains("generation") && m["generation"].is_number_unsigned()) {
      c.generation = m["generation"].get<std::uint64_t>();
    }
    if (m.contains("nodes") && m["nodes"].is_object()) {
      json files = json::array();
      for (const auto& [name, node] : m["nodes"].items()) {
        if (node.is_object() && node.contains("file")) files.push_back(node["file"]);
        // The next generation's files, which a write that crashed before its manifest leaves
        // (before the file list existed, nothing else named them).
        if (name.size() < 200 && name.find('/') == std::string::npos && c.generation < ~0ull) {
          const std::string next = fmt::format("{}.{}.bin", name, c.generation + 1);
          for (const std::string& f : {next, next + ".tmp"}) {
            if (fs::exists(root / f, ec)) files.push_back(f);
          }
        }
      }
      add_names(dir, files, kCheckpointManifest, c.listed);
    }
    own_json = true;
  }
  if (fs::exists(root / kCheckpointFiles, ec)) {
    const json f = read_own_json(dir, kCheckpointFiles, kFilesFormat, "checkpoint file list");
    add_names(dir, f.contains("files") ? f["files"] : json(), kCheckpointFiles, c.listed);
    own_json = true;
  }
  // The fixed names' temporary files are ours where the directory is: a crash while the manifest
  // or the list was replaced leaves one.
  const bool ours = lock_ours || own_json;
  const std::string manifest_temp = std::string(kCheckpointManifest) + ".tmp";
  const std::string files_temp = std::string(kCheckpointFiles) + ".tmp";
  // In name order, so that the file a refusal names does not depend on the file system.
  std::map<std::string, bool> entries;  // name -> is a regular file
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    std::error_code type_ec;
    entries[entry.path().filename().string()] = entry.is_regular_file(type_ec);
  }
  if (ec) refuse(dir, fmt::format("cannot list the directory ({})", ec.message()));
  for (const auto& [name, regular] : entries) {
    const bool fixed = name == kCheckpointManifest || name == kCheckpointFiles;
    const bool temp = name == manifest_temp || name == files_temp;
    if (fixed || (name == kCheckpointLock && lock_ours) || (temp && ours) ||
        (c.listed.count(name) && regular)) {
      continue;
    }
    refuse(dir, fmt::format("holds {}, which this checkpoint did not write (--checkpoint removes "
                            "the files of its older checkpoints, so it takes only a directory of "
                            "its own) {}",
                            name, kOwnDirectory));
  }
  return c;
}

std::string files_json(const std::set<std::string>& files) {
  json j;
  j["format"] = kFilesFormat;
  j["files"] = files;
  return j.dump(2) + "\n";
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string temp = path + ".tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) write_failed(temp, "create", errno);
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      write_failed(temp, "write", error);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    write_failed(temp, "flush", error);
  }
  if (::close(fd) != 0) write_failed(temp, "close", errno);
  if (std::rename(temp.c_str(), path.c_str()) != 0) write_failed(path, "rename onto", errno);
  const fs::path parent = fs::path(path).parent_path();
  fsync_directory(parent.empty() ? "." : parent.string());
}

CheckpointDir::CheckpointDir(std::string path) : path_(std::move(path)) {
  if (path_.empty()) refuse("''", "the checkpoint directory is empty give a directory");
  std::error_code ec;
  const fs::file_status status = fs::status(path_, ec);
  if (fs::exists(status) && !fs::is_directory(status)) {
    refuse(path_, "is not a directory (a checkpoint is a directory of files) " +
                      std::string(kOwnDirectory));
  }
  fs::create_directories(path_, ec);
  if (ec) {
    refuse(path_, fmt::format("cannot create the checkpoint directory ({}) give --checkpoint a "
                              "directory that can be written",
                              ec.message()));
  }
  // A directory without a lock file of ours is checked before one is made, so that nothing is
  // added to a directory that is not ours. Every directory is checked again under the lock, where
  // no other writer changes it (before it, a writer at work may be seen half way).
  const std::string lock = (fs::path(path_) / kCheckpointLock).string();
  if (!own_lock(lock)) scan(path_);
  do {
    lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  } while (lock_fd_ < 0 && errno == EINTR);
  if (lock_fd_ < 0) {
    refuse(path_, fmt::format("cannot create {} in the checkpoint directory ({}) give "
                              "--checkpoint a directory that can be written",
                              kCheckpointLock, std::strerror(errno)));
  }
  int rc;
  do {
    rc = ::flock(lock_fd_, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int error = errno;
    ::close(lock_fd_);
    lock_fd_ = -1;
    if (error != EWOULDBLOCK) {
      refuse(path_, fmt::format("cannot lock {} ({})", kCheckpointLock, std::strerror(error)));
    }
    const std::string pid = lock_holder(lock);
    refuse(path_, fmt::format("another run{} holds this checkpoint directory (its lock {}; two "
                              "writers would remove each other's files) give this run its own "
                              "--checkpoint directory, or wait until that run ends",
                              pid.empty() ? std::string() : " (pid " + pid + ")", kCheckpointLock));
  }
  try {
    // The pid first, so that a writer refused from now on is told this one.
    const std::string text = fmt::format("{}pid {}\n", kLockHeader, static_cast<long>(::getpid()));
    if (::ftruncate(lock_fd_, 0) != 0 ||
        ::pwrite(lock_fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
      write_failed(lock, "write", errno);
    }
    const Contents c = scan(path_);
    generation_ = c.generation;
    listed_.assign(c.listed.begin(), c.listed.end());
  } catch (...) {
    ::close(lock_fd_);
    throw;
  }
}

CheckpointDir::~CheckpointDir() {
  // The file stays: removing it would let a third writer lock a new file while a second holds the
  // old one.
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void CheckpointDir::write(
    Checkpoint checkpoint,
    const std::map<std::string, std::pair<std::string, std::string>>& states) {
  const fs::path dir(path_);
  const std::uint64_t generation = generation_ + 1;
  std::set<std::string> next;
  for (const auto& [name, state] : states) next.insert(fmt::format("{}.{}.bin", name, generation));
  // Listed before they exist: a crash at any later point leaves only listed files.
  std::set<std::string> all(listed_.begin(), listed_.end());
  for (const std::string& f : next) all.insert({f, f + ".tmp"});
  write_file_atomically((dir / kCheckpointFiles).string(), files_json(all));
  checkpoint.nodes.clear();
  for (const auto& [name, state] : states) {
    NodeStateFile f;
    f.type = state.first;
    f.file = fmt::format("{}.{}.bin", name, generation);
    f.bytes = state.second.size();
    f.fnv1a64 = detail::fnv1a64(state.second);
    write_file_atomically((dir / f.file).string(), state.second);
    checkpoint.nodes[name] = f;
  }
  json j = json::parse(checkpoint_json(checkpoint));
  j["generation"] = generation;
  write_file_atomically((dir / kCheckpointManifest).string(), j.dump(2) + "\n");
  generation_ = generation;
  // The older generation's files, and what a crashed write left, go now: only names listed.
  for (const std::string& f : all) {
    if (next.count(f)) continue;
    if (::unlink((dir / f).c_str()) != 0 && errno != ENOENT) {
      write_failed((dir / f).string(), "remove", errno);
    }
  }
  write_file_atomically((dir / kCheckpointFiles).string(), files_json(next));
  listed_.assign(next.begin(), next.end());
}

void write_checkpoint(const std::string& dir, Checkpoint checkpoint,
                      const std::map<std::string, std::pair<std::string, std::string>>& states) {
  CheckpointDir(dir).write(std::move(checkpoint), states);
}

}  // namespace flowfeed
