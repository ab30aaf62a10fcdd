#include "classes.hpp"

#include <exception>
#include <stdexcept>
#include <string>

#if FLOWFEED_RUNNER_IMAGES
#include "flowfeed/nodes/detail/image_folder_index.hpp"
#endif

namespace {

#if FLOWFEED_RUNNER_IMAGES
/// One loader's mapping: its classes as image_folder labels them (the same walk).
void print_index(const std::string& node, const std::string& root, const std::string& list,
                 std::ostream& out) {
  if (!list.empty()) {
    out << node << ": labels from the file list " << list << " (no class names)\n";
    return;
  }
  const flowfeed::ImageFolderIndex index = flowfeed::ImageFolderIndex::walk(root);
  const auto& classes = index.classes();
  out << node << ": " << classes.size() << (classes.size() == 1 ? " class" : " classes") << ", "
      << index.files().size() << " images under " << root << "\n";
  for (std::size_t c = 0; c < classes.size(); ++c) out << c << "\t" << classes[c] << "\n";
}

void print_loader(const std::string& node, const flowfeed::Params& params, std::ostream& out) {
  const std::string root = params.get_string("root");
  try {
    print_index(node, root, params.get_string("file_list"), out);
  } catch (const std::exception& e) {
    throw std::runtime_error(node + " (image_folder): " + e.what());
  }
}
#endif

}  // namespace

int list_classes(const flowfeed::PipelineConfig& config, std::ostream& out, std::ostream& err) {
#if FLOWFEED_RUNNER_IMAGES
  int found = 0;
  try {
    for (const flowfeed::NodeSpec& node : config.nodes) {
      if (node.type == "image_folder") {
        print_loader("node '" + node.name + "'", node.params, out);
        ++found;
      }
      for (std::size_t s = 0; s < node.sources.size(); ++s) {
        if (node.sources[s].type != "image_folder") continue;
        print_loader("node '" + node.name + "' source " + std::to_string(s), node.sources[s].params,
                     out);
        ++found;
      }
    }
  } catch (const std::exception& e) {
    err << "error: " << e.what() << "\n";
    return 1;
  }
  if (found > 0) return 0;
  err << "pipeline_runner: --list-classes: the config has no image_folder loader\n";
  return 2;
#else
  (void)config;
  (void)out;
  err << "pipeline_runner: --list-classes: this build has no image family (image_folder is "
         "not in it)\n";
  return 2;
#endif
}
