#include "flowfeed/nodes/detail/image_folder_index.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "fd.hpp"
#include "flowfeed/config.hpp"

namespace flowfeed {

namespace {

bool has_image_extension(std::string_view name) {
  const std::size_t dot = name.rfind('.');
  if (dot == std::string_view::npos) return false;
  std::string ext(name.substr(dot + 1));
  if (ext.size() > 4) return false;
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

/// A file found below a class directory: its path relative to the root (in ClassWalk::names), and
/// where its file name starts in it (so files sort by directory, then name, as sorted(os.walk())
/// yields them).
struct Found {
  std::uint64_t at = 0;
  std::uint32_t len = 0;
  std::uint32_t name_at = 0;
};

/// What the walk of one class directory found.
struct ClassWalk {
  std::vector<Found> files;
  std::string names;  ///< the files' paths, one after another
  std::size_t special = 0;
  std::string error;
};

std::string list_error(const std::string& root, const std::string& rel, int err) {
  return fmt::format("cannot list directory '{}/{}': {}", root, rel, std::strerror(err));
}

/// Walks the class directory `cls` below `root_fd` (named `root` in messages), one directory
/// open at a time: its files are collected, its sub-directories walked after it. O_NONBLOCK and
/// O_DIRECTORY keep a special file from ever blocking an open.
void walk_class(int root_fd, const std::string& root, const std::string& cls, ClassWalk& w) {
  std::vector<std::string> todo{cls};
  std::set<std::pair<dev_t, ino_t>> seen;
  while (!todo.empty()) {
    const std::string rel = std::move(todo.back());
    todo.pop_back();
    const int fd = ::openat(root_fd, rel.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      w.error = list_error(root, rel, errno);
      return;
    }
    struct stat dir_stat {};
    if (::fstat(fd, &dir_stat) != 0 || !seen.insert({dir_stat.st_dev, dir_stat.st_ino}).second) {
      ::close(fd);
      continue;  // reached again through a link: walked once
    }
    DIR* dir = ::fdopendir(fd);
    if (dir == nullptr) {
      w.error = list_error(root, rel, errno);
      ::close(fd);
      return;
    }
    for (;;) {
      errno = 0;
      const dirent* e = ::readdir(dir);
      if (e == nullptr) {
        if (errno != 0) w.error = list_error(root, rel, errno);
        break;
      }
      const std::string_view name(e->d_name);
      if (name == "." || name == "..") continue;
      unsigned char type = e->d_type;
      if (type == DT_LNK || type == DT_UNKNOWN) {
        struct stat st {};
        if (::fstatat(::dirfd(dir), e->d_name, &st, 0) != 0) {
          // A dangling link: torchvision lists it; opening it makes a bad sample.
          type = DT_REG;
        } else if (S_ISREG(st.st_mode)) {
          type = DT_REG;
        } else if (S_ISDIR(st.st_mode)) {
          type = DT_DIR;
        } else {
          type = DT_FIFO;
        }
      }
      if (type == DT_REG) {
        if (has_image_extension(name)) {
          Found f;
          f.at = w.names.size();
          f.len = static_cast<std::uint32_t>(rel.size() + 1 + name.size());
          f.name_at = static_cast<std::uint32_t>(rel.size() + 1);
          w.names.append(rel).append(1, '/').append(name);
          w.files.push_back(f);
        }
      } else if (type == DT_DIR) {
        todo.push_back(rel + "/" + std::string(name));
      } else {
        ++w.special;  // FIFO, socket or device: never opened
      }
    }
    ::closedir(dir);
    if (!w.error.empty()) return;
  }
  const std::string_view names(w.names);
  std::sort(w.files.begin(), w.files.end(), [names](const Found& a, const Found& b) {
    const std::string_view ad = names.substr(a.at, a.name_at - 1);
    const std::string_view bd = names.substr(b.at, b.name_at - 1);
    if (ad != bd) return ad < bd;
    return names.substr(a.at + a.name_at, a.len - a.name_at) <
           names.substr(b.at + b.name_at, b.len - b.name_at);
  });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

ImageFolderIndex ImageFolderIndex::walk(const std::string& root) {
  ImageFolderIndex index;
  const int root_fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
  if (root_fd < 0) {
    throw DataError(fmt::format("root '{}' cannot be listed: {}", root, std::strerror(errno)));
  }
  Fd root_closer(root_fd);
  {
    DIR* dir = ::fdopendir(::dup(root_fd));
    if (dir == nullptr) {
      throw DataError(fmt::format("root '{}' cannot be listed: {}", root, std::strerror(errno)));
    }
    for (;;) {
      errno = 0;
      const dirent* e = ::readdir(dir);
      if (e == nullptr) {
        const int err = errno;
        ::closedir(dir);
        if (err != 0) throw DataError(list_error(root, "", err));
        break;
      }
      const std::string name(e->d_name);
      if (name == "." || name == "..") continue;
      bool is_dir = e->d_type == DT_DIR;
      if (e->d_type == DT_LNK || e->d_type == DT_UNKNOWN) {
        struct stat st {};
        is_dir = ::fstatat(root_fd, e->d_name, &st, 0) == 0 && S_ISDIR(st.st_mode);
      }
      if (is_dir) index.classes_.push_back(name);
    }
  }
  std::sort(index.classes_.begin(), index.classes_.end());
  if (index.classes_.empty()) {
    throw DataError(
        fmt::format("root '{}' holds no class directory (images go in root/<class>/)", root));
  }
  std::vector<ClassWalk> walks(index.classes_.size());
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, walks.size(), 1),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t c = r.begin(); c != r.end(); ++c) {
                        walk_class(root_fd, root, index.classes_[c], walks[c]);
                      }
                    });
  std::size_t files = 0;
  std::size_t bytes = 0;
  for (const ClassWalk& w : walks) {
    if (!w.error.empty()) throw DataError(w.error);
    files += w.files.size();
    index.special_files_ += w.special;
    bytes += w.names.size();
  }
  if (files == 0) {
    throw DataError(fmt::format(
        "root '{}' holds no image (.jpg, .jpeg or .png below a class directory)", root));
  }
  if (files > static_cast<std::size_t>(std::numeric_limits<std::uint32_t>::max())) {
    throw DataError(fmt::format("root '{}' holds {} images, more than 2^32 - 1", root, files));
  }
  index.base_ = root.empty() || root.back() == '/' ? root : root + "/";
  index.files_.reserve(files);
  index.names_.reserve(bytes);
  for (std::size_t c = 0; c < walks.size(); ++c) {
    const std::string& names = walks[c].names;
    for (const Found& f : walks[c].files) {
      FolderFile file;
      file.name_at = index.names_.size();
      file.name_len = f.len;
      file.label = static_cast<std::int32_t>(c);
      index.names_.insert(index.names_.end(), names.begin() + static_cast<std::ptrdiff_t>(f.at),
                          names.begin() + static_cast<std::ptrdiff_t>(f.at + f.len));
      index.files_.push_back(file);
    }
    std::vector<Found>().swap(walks[c].files);
    std::string().swap(walks[c].names);
  }
  return index;
}

ImageFolderIndex ImageFolderIndex::read_list(const std::string& list, const std::string& base,
                                             int num_classes) {
  std::ifstream in(list, std::ios::binary);
  if (!in) {
    throw DataError(fmt::format("file_list '{}' cannot be read: {}", list, std::strerror(errno)));
  }
  ImageFolderIndex index;
  if (!base.empty()) {
    index.base_ = base.back() == '/' ? base : base + "/";
  } else {
    const std::size_t slash = list.rfind('/');
    index.base_ = slash == std::string::npos ? std::string() : list.substr(0, slash + 1);
  }
  std::string line;
  std::size_t number = 0;
  bool first_row = true;
  while (std::getline(in, line)) {
    ++number;
    const std::string_view row = trim(line);
    if (row.empty() || row.front() == '#') continue;
    const bool may_be_header = first_row;
    first_row = false;
    std::size_t cut = row.rfind(',');
    if (cut == std::string_view::npos) cut = row.find_last_of(" \t");
    auto bad = [&](const std::string& why) {
      return DataError(fmt::format("{}:{}: {}", list, number, why));
    };
    if (cut == std::string_view::npos) {
      throw bad(fmt::format("'{}' is not 'path,label'", row.substr(0, 200)));
    }
    const std::string_view path = trim(row.substr(0, cut));
    const std::string_view label = trim(row.substr(cut + 1));
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(label.data(), label.data() + label.size(), v);
    if (label.empty() || ec != std::errc() || end != label.data() + label.size()) {
      if (may_be_header) continue;  // a header such as "path,label"
      throw bad(fmt::format("label '{}' is not an integer", label.substr(0, 32)));
    }
    const bool out = num_classes > 0 ? v < 0 || v >= num_classes
                                     : v < std::numeric_limits<std::int32_t>::min() ||
                                           v > std::numeric_limits<std::int32_t>::max();
    if (out) {
      throw bad(fmt::format(
          "label {} is out of range {}", v,
          num_classes > 0 ? fmt::format("[0, {})", num_classes) : std::string("for int32")));
    }
    if (path.empty()) throw bad("the path is empty");
    FolderFile file;
    file.name_at = index.names_.size();
    file.name_len = static_cast<std::uint32_t>(path.size());
    file.label = static_cast<std::int32_t>(v);
    index.names_.insert(index.names_.end(), path.begin(), path.end());
    index.files_.push_back(file);
  }
  if (index.files_.empty()) {
    throw DataError(fmt::format("file_list '{}' lists no file", list));
  }
  index.files_.shrink_to_fit();
  index.names_.shrink_to_fit();
  return index;
}

std::string ImageFolderIndex::path(const FolderFile& f) const {
  const std::string_view n = name(f);
  if (!n.empty() && n.front() == '/') return std::string(n);
  std::string p;
  p.reserve(base_.size() + n.size());
  p.append(base_).append(n);
  return p;
}

std::size_t ImageFolderIndex::memory_bytes() const noexcept {
  std::size_t bytes = files_.capacity() * sizeof(FolderFile) + names_.capacity();
  for (const std::string& c : classes_) bytes += sizeof(std::string) + c.capacity();
  return bytes;
}

}  // namespace flowfeed
