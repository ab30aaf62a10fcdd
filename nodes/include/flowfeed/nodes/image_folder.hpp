#pragma once
/// \file
/// The `image_folder` loader: images in class directories (`root/<class>/**/<file>`, as
/// torchvision's ImageFolder) or named by a file list, decoded, cropped and flipped exactly as the
/// `webdataset` loader does. docs/IMAGES.md describes it.

#include <string>

#include "flowfeed/nodes/webdataset.hpp"

namespace flowfeed {

/// Options of the `image_folder` loader (the params of its schema).
struct ImageFolderOptions : ImageOptions {
  std::string root;       ///< the class tree; with file_list, the base of its relative paths
  std::string file_list;  ///< text/CSV rows `path,label` instead of the class tree
};

/// Registers `image_folder` (load).
void register_image_folder(Registry& registry);

}  // namespace flowfeed
