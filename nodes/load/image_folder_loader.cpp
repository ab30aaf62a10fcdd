// The `image_folder` loader: the index of a class tree or file list (ImageFolderIndex), each
// sample's file read with one open/fstat/read, then the decode every image loader shares.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

#include "fd.hpp"
#include "flowfeed/config.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/detail/image_folder_index.hpp"
#include "flowfeed/nodes/detail/image_samples.hpp"
#include "flowfeed/nodes/image_folder.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/stats.hpp"

namespace flowfeed {

namespace {

/// A file larger than this is a bad sample (no image the decoder takes is near it).
constexpr std::uint64_t kMaxFileBytes = std::uint64_t{1} << 30;

/// Reads each sample's file whole (open with O_NONBLOCK, fstat, read), takes its format from its
/// first bytes and decodes it with decode_image_sample(); `y` is the class index (or the list's
/// label). A file that vanished, is no longer a regular file, changed size while read or does not
/// decode is a bad sample: skipped under `on_error: skip`, else a DataError naming its path.
class ImageFolderLoader final : public LoaderNode {
 public:
  explicit ImageFolderLoader(ImageFolderOptions options)
      : options_(std::move(options)), workers_(std::make_unique<DecodeWorkers>()) {
    const auto start = std::chrono::steady_clock::now();
    index_ =
        options_.file_list.empty()
            ? ImageFolderIndex::walk(options_.root)
            : ImageFolderIndex::read_list(options_.file_list, options_.root, options_.num_classes);
    index_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::size_t classes = index_.classes().size();
    if (options_.num_classes > 0 && classes > static_cast<std::size_t>(options_.num_classes)) {
      throw DataError(
          fmt::format("root '{}' has {} class directories, more than "
                      "num_classes = {}",
                      options_.root, classes, options_.num_classes));
    }
    target_ = decode_target(options_);
    sample_bytes_ = image_bytes(options_);
  }

  static ImageFolderOptions options_from(const NodeSpec& spec) {
    ImageFolderOptions o;
    o.root = spec.params.get_string("root");
    o.file_list = spec.params.get_string("file_list");
    std::vector<std::string> problems;
    image_options_from(spec, o, problems);
    if (o.root.empty() && o.file_list.empty()) {
      problems.push_back(fmt::format(
          "{}: nodes.{}.params: give root (a class tree root/<class>/<file>) or file_list (rows "
          "path,label)",
          spec.loc.str(), spec.name));
    }
    if (!problems.empty()) throw ConfigError(std::move(problems));
    return o;
  }

  void setup(BuildContext& context) override {
    policy_ = row_policy(options_.parallel, context.pipeline_options());
    node_name_ = context.spec().name;
    drops_.set_who(fmt::format("node '{}' (image_folder)", node_name_));
    pool_ = &context.make_batch_pool("host", MemoryKind::pageable, context.layout().capacity(),
                                     Allocator::host());
  }
  void begin_run() override { drops_.reset(); }
  std::size_t size() const override { return index_.files().size(); }
  std::vector<TensorSpec> sample_tensors() const override { return image_tensors(options_); }

  void process(Batch& batch) override {
    batch.host = pool_->acquire();
    auto* x = reinterpret_cast<std::uint8_t*>(batch.tensor(Tier::host, 0));
    auto* y = reinterpret_cast<std::int32_t*>(batch.tensor(Tier::host, 1));
    load_rows(batch, policy_, drops_, [&](std::size_t row) {
      load_sample(batch.samples[row], batch.epoch, x + row * sample_bytes_, y + row);
    });
  }

  void finish(RunReport& report) override {
    drops_.finish(report);
    const std::string& n = node_name_;
    report.extra[n + ".files"] = static_cast<double>(index_.files().size());
    report.extra[n + ".index_bytes"] = static_cast<double>(index_.memory_bytes());
    report.extra[n + ".index_seconds"] = index_seconds_;
    report.extra[n + ".special_files_ignored"] = static_cast<double>(index_.special_files());
    if (!options_.file_list.empty()) return;
    report.extra[n + ".classes"] = static_cast<double>(index_.classes().size());
    for (std::size_t c = 0; c < index_.classes().size(); ++c) {
      report.extra[n + ".class." + index_.classes()[c]] = static_cast<double>(c);
    }
  }

 private:
  void load_sample(std::uint32_t sample, std::uint32_t epoch, std::uint8_t* x, std::int32_t* y) {
    const FolderFile& f = index_.files()[sample];
    const std::string path = index_.path(f);
    // O_NONBLOCK: a file replaced by a FIFO since the walk must not block the open.
    const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
    if (fd.get() < 0) {
      throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) {
      throw DataError(fmt::format("{}: cannot stat: {}", path, std::strerror(errno)));
    }
    if (!S_ISREG(st.st_mode)) {
      throw DataError(fmt::format(
          "{}: is not a regular file (a FIFO, socket, device or directory); not read", path));
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size == 0 || size > kMaxFileBytes) {
      throw DataError(
          fmt::format("{}: holds {} bytes (an image file holds 1 byte to 1 GiB)", path, size));
    }
    DecodeWorker& w = workers_->per_thread.local();
    // One byte more than fstat said: a file that grew since is seen to have changed.
    if (w.encoded.size() < size + 1) w.encoded.resize(size + 1);
    std::size_t done = 0;
    while (done < size + 1) {
      const ssize_t got = ::read(fd.get(), w.encoded.data() + done, size + 1 - done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        throw DataError(
            fmt::format("{}: read failed after {} bytes: {}", path, done, std::strerror(errno)));
      }
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    if (done != size) {
      throw DataError(fmt::format("{}: changed while read ({} bytes{}, fstat said {})", path, done,
                                  done > size ? " or more" : "", size));
    }
    const std::uint8_t* b = w.encoded.data();
    ImageFormat format = ImageFormat::jpeg;
    if (size >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) {
      format = ImageFormat::jpeg;
    } else if (size >= 8 && std::memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0) {
      format = ImageFormat::png;
    } else {
      throw DataError(fmt::format("{}: is neither a JPEG nor a PNG (by its first bytes)", path));
    }
    *y = f.label;
    decode_image_sample(w.decoder, b, size, format, options_, target_, epoch, sample, path,
                        node_name_, x);
  }

  ImageFolderOptions options_;
  ImageFolderIndex index_;
  double index_seconds_ = 0;
  DecodeTarget target_;
  std::size_t sample_bytes_ = 0;
  BufferPool* pool_ = nullptr;
  RowPolicy policy_;
  std::string node_name_;
  std::unique_ptr<DecodeWorkers> workers_;
  DropLog drops_;
};

}  // namespace

void register_image_folder(Registry& registry) {
  Schema s;
  s.add_string("root",
               "class tree root/<class>/**/<file>.jpg|jpeg|png (classes: sorted directory names, "
               "as torchvision's ImageFolder); with file_list, the base of its relative paths",
               std::string(""));
  s.add_string("file_list",
               "text/CSV file of rows 'path,label' used instead of the class tree (relative paths "
               "from root, or from the list's directory)",
               std::string(""));
  add_image_params(s);
  registry.set(factory_type(
      "image_folder", Role::load, std::move(s),
      [](const NodeSpec& spec) {
        return std::make_unique<ImageFolderLoader>(ImageFolderLoader::options_from(spec));
      },
      "image files in class directories (torchvision ImageFolder) or a file list, decoded like "
      "webdataset: x uint8 [H, W, C] or [C, H, W], y int32 the class index"));
}

}  // namespace flowfeed
