#pragma once
/// \file
/// The sample index of the `image_folder` loader: every image file of a class tree
/// (`root/<class>/**/<file>.jpg|jpeg|png`), or every row of a file list, with its label.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flowfeed {

/// One image file: its path (relative to the index's base) in the names, and its label.
struct FolderFile {
  std::uint64_t name_at = 0;
  std::uint32_t name_len = 0;
  std::int32_t label = 0;
};

/// The files of an image folder, in torchvision ImageFolder's order. Memory: sizeof(FolderFile)
/// (16) + the relative path's bytes per file, plus the class names.
class ImageFolderIndex {
 public:
  /// Walks `root`: the classes are its sub-directories (symbolic links to directories too) sorted
  /// by byte value, labelled 0, 1, ... in that order, an empty one keeping its label; a class's
  /// files are the regular files (or links to them) at any depth below it whose name ends in
  /// .jpg, .jpeg or .png in any case, ordered by (directory path, file name) as torchvision's
  /// sorted(os.walk()). Other files, files directly in `root` and special files (FIFOs, sockets,
  /// devices: never opened) are ignored; a directory reached twice through links is walked once.
  /// The class directories are walked in parallel (tbb::parallel_for). Throws DataError for a
  /// root or directory that cannot be listed, no class directory, or no image.
  static ImageFolderIndex walk(const std::string& root);
  /// Reads the file list `list`: per line `path,label` (or `path label`, the label after the last
  /// comma or blank), blank lines and lines starting with '#' skipped, a first line whose label
  /// is not an integer taken as a header. A relative path is relative to `base` (the list's own
  /// directory when empty). Labels must be in [0, num_classes) when num_classes > 0, else
  /// int32. Throws DataError naming list:line for a bad row, or a list without rows.
  static ImageFolderIndex read_list(const std::string& list, const std::string& base,
                                    int num_classes);

  const std::vector<FolderFile>& files() const noexcept { return files_; }
  /// The class names, by label (walk only; empty for a list).
  const std::vector<std::string>& classes() const noexcept { return classes_; }
  /// The file's path as given (relative to base()).
  std::string_view name(const FolderFile& f) const noexcept {
    return {names_.data() + f.name_at, f.name_len};
  }
  /// The path to open: base() + name, or the name when it is absolute.
  std::string path(const FolderFile& f) const;
  /// The directory relative names are in, with a trailing '/' (empty for the current one).
  const std::string& base() const noexcept { return base_; }
  /// Bytes the index holds (files, names and classes).
  std::size_t memory_bytes() const noexcept;
  /// Special files (FIFOs, sockets, devices) the walk ignored.
  std::size_t special_files() const noexcept { return special_files_; }

 private:
  std::string base_;
  std::vector<FolderFile> files_;
  std::vector<char> names_;
  std::vector<std::string> classes_;
  std::size_t special_files_ = 0;
};

}  // namespace flowfeed
