#pragma once
/// \file
/// Exact resume: the position of a run as one global cursor over the (seed, epoch) sample order,
/// saved with the state of the nodes that keep some (a model's weights) in one checkpoint
/// directory, written atomically as a set. docs/RESUME.md explains the rules.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"

namespace flowfeed {

class Sampler;  ///< sampler.hpp

/// One node's saved state: a file in the checkpoint directory, checked when it is read.
struct NodeStateFile {
  std::string type;           ///< the node's type when it was saved (e.g. "mlp")
  std::string file;           ///< file name inside the checkpoint directory
  std::uint64_t bytes = 0;    ///< its size
  std::uint64_t fnv1a64 = 0;  ///< its FNV-1a 64-bit hash
};

/// The position of a run: everything before it finished the train step (or, in pull mode, was
/// released by the caller); batches merely prefetched are not counted, so they are delivered again
/// after a resume. The cursor is global: `samples` counts positions of epoch `epoch`'s global
/// order (the permutation of the whole data set that (seed, epoch) fixes), which ranks in step
/// agree on, whatever the world size.
struct Checkpoint {
  /// The newest file format this build reads and writes: 2 when the order is `shards` (so that a
  /// build without that order refuses the file instead of resuming another order), else 1.
  static constexpr int kVersion = 2;
  int version = kVersion;  ///< format version of the file read

  // The sample order the cursor points into.
  std::uint64_t seed = 0;                    ///< sampler.seed
  bool shuffle = false;                      ///< sampler.shuffle
  bool drop_last = false;                    ///< sampler.drop_last
  std::uint64_t dataset_size = 0;            ///< samples in the data set
  SampleOrder order = SampleOrder::samples;  ///< sampler.order (version 1: samples)
  std::uint64_t shuffle_window = 0;          ///< sampler.shuffle_window, under order: shards
  std::uint64_t data_shards = 1;             ///< the loader's non-empty shards, under order: shards

  // The cursor.
  std::uint32_t epoch = 0;    ///< the epoch of the next batch (pipeline.epochs once all are done)
  std::uint64_t samples = 0;  ///< positions of that epoch's global order before the next global
                              ///< batch: global steps finished × global_batch
  int world = 1;              ///< ranks when it was written
  int rank = 0;               ///< the rank that wrote it
  std::uint64_t batch_size = 0;    ///< samples per batch per rank when it was written
  std::uint64_t global_batch = 0;  ///< world × batch_size: one batch from every rank
  /// This rank's batches after the cursor that finished already (an unordered run finishes
  /// batches out of order), as offsets 1, 2, ... from the cursor's batch in this rank's sequence.
  /// A resume skips them, so that they are not trained twice.
  std::vector<std::uint64_t> finished_ahead;
  std::uint64_t steps = 0;  ///< batches this rank finished since the first run (informational)

  /// Node name -> its saved state, for the nodes that have one (Node::has_state).
  std::map<std::string, NodeStateFile> nodes;
  /// The directory it was read from (empty for one made by Pipeline::checkpoint()).
  std::string dir;
};

/// Where a resumed run starts in this rank's sequence of batches (index = epoch ×
/// batches_per_epoch + index in the epoch).
struct ResumePoint {
  std::uint64_t first = 0;          ///< the first batch to deliver
  std::vector<std::uint64_t> skip;  ///< later batches that finished already (ascending)
};

/// The file in a checkpoint directory that holds the cursor and names the node files; written last.
inline constexpr const char* kCheckpointManifest = "pipeline.json";
/// The file in a checkpoint directory that a writer holds an flock on (CheckpointDir); it holds the
/// writer's pid. Never removed.
inline constexpr const char* kCheckpointLock = "flowfeed.lock";
/// The file in a checkpoint directory that lists every node file the writer created and has not
/// removed yet, written before they are created: what a later writer may remove.
inline constexpr const char* kCheckpointFiles = "flowfeed-files.json";
/// The most bytes a manifest or a file list may hold (16 MiB; a manifest of a run's cursor takes
/// 1 KiB, plus ~10 bytes per batch finished ahead of the cursor).
inline constexpr std::size_t kMaxManifestBytes = std::size_t{16} << 20;

/// The JSON text of `checkpoint` (the manifest).
std::string checkpoint_json(const Checkpoint& checkpoint);

/// The saved cursor's fields as some holder keeps them: a checkpoint's manifest (JSON), the dict
/// Pipeline.state_dict() returns (Python). read_cursor() checks them the same way for every holder;
/// the holder reads values of its own types and names itself in messages. Keys are dotted
/// ("cursor.epoch").
class CursorFields {
 public:
  virtual ~CursorFields() = default;
  /// What holds the fields, in messages: "checkpoint", "state".
  virtual std::string noun() const = 0;
  /// What a message about a corrupt holder advises: "resume from a complete one".
  virtual std::string remedy() const = 0;
  /// What a message about a holder of another kind advises (a wrong `format`).
  virtual std::string other_kind_remedy() const = 0;
  /// What a message about a holder from a newer flowfeed advises.
  virtual std::string newer_remedy() const = 0;
  /// Throws ConfigError naming the holder, `key` and `problem`.
  [[noreturn]] virtual void fail(const std::string& key, const std::string& problem) const = 0;
  /// The value at `key` as the holder shows it in messages ("nothing" when absent).
  virtual std::string shown(const std::string& key) const = 0;
  /// `text` as the holder quotes a string.
  virtual std::string quoted(const std::string& text) const = 0;
  /// The value at `key`; a missing field or one of another type fails naming the key.
  virtual std::uint64_t count(const std::string& key) const = 0;
  virtual bool flag(const std::string& key) const = 0;
  virtual std::string text(const std::string& key) const = 0;
  /// A list of non-negative integers.
  virtual std::vector<std::uint64_t> counts(const std::string& key) const = 0;
  /// Whether `key` is present and a string equal to `value`.
  virtual bool text_is(const std::string& key, const std::string& value) const = 0;

  /// The message tail of a corrupt value: "(the checkpoint is corrupt) resume from a complete one".
  std::string corrupt() const { return "(the " + noun() + " is corrupt) " + remedy(); }
};

/// Checks `fields`' format (which must be `format`), version, sampler and cursor, every field's
/// type and range, products such as world x batch_size included, and returns them as a Checkpoint
/// without nodes. Throws ConfigError through CursorFields::fail.
Checkpoint read_cursor(const CursorFields& fields, const std::string& format);

/// Reads and checks a checkpoint: `path` is its directory or the manifest in it. Checks the format,
/// the version, every field's type and range (products such as world × batch_size included), and
/// that every node file named is there with its size and hash. Files are read with bounds: a
/// manifest over kMaxManifestBytes, a node file larger than the manifest says, and anything but a
/// regular file (a device, a FIFO, a directory) are refused unread. Throws ConfigError naming the
/// file and the field:
/// `DIR/pipeline.json: cursor.samples: 70 is not a multiple of cursor.global_batch 64 (...)`.
Checkpoint read_checkpoint(const std::string& path);

/// Reads node `name`'s state file from a checkpoint read_checkpoint() returned (checked again).
/// Throws ConfigError when the checkpoint has none for it.
std::string read_node_state(const Checkpoint& checkpoint, const std::string& name);

/// A checkpoint directory held for writing. A directory is this checkpoint's own when every entry
/// in it is one flowfeed writes there: the manifest (a flowfeed manifest), the lock file, the file
/// list, their temporary files, and the node files the manifest or the file list names. Opening
/// one creates the directory (and its parents) when missing, refuses any other directory, then
/// takes an exclusive flock on its lock file, held until the object is destroyed: a second writer
/// (in this process or another) is refused. Writing a checkpoint removes only files the file list
/// or the manifest named. docs/RESUME.md describes the directory.
class CheckpointDir {
 public:
  /// Opens `path` for writing. Throws ConfigError naming the directory: for a path that cannot be
  /// created or written (a parent that is a file, no permission), a directory holding a file that
  /// is not this checkpoint's own (naming one), and a directory another writer holds (naming its
  /// pid).
  explicit CheckpointDir(std::string path);
  /// Releases the lock.
  ~CheckpointDir();
  CheckpointDir(const CheckpointDir&) = delete;
  CheckpointDir& operator=(const CheckpointDir&) = delete;

  /// The directory, as given.
  const std::string& path() const noexcept { return path_; }

  /// Writes a checkpoint atomically as a set: the file list first names the new generation's node
  /// files (`NAME.GENERATION.bin`) with the old ones; each node's state goes to its file (written
  /// to a temporary name, flushed to disk, renamed), then the manifest naming them (the same way);
  /// then the older generation's files are removed and the file list names only the new ones. A
  /// crash at any point leaves the previous checkpoint or the new one, whole, and every file it
  /// leaves listed. `states` maps node name to its type and state bytes. Throws Error naming the
  /// file when a write fails. Not thread-safe: one writer at a time.
  void write(Checkpoint checkpoint,
             const std::map<std::string, std::pair<std::string, std::string>>& states);

 private:
  std::string path_;
  int lock_fd_ = -1;
  std::uint64_t generation_ = 0;     // of the manifest in place (0: none yet)
  std::vector<std::string> listed_;  // node files written and not removed
};

/// Opens `dir` as a CheckpointDir for the length of one write (see there).
void write_checkpoint(const std::string& dir, Checkpoint checkpoint,
                      const std::map<std::string, std::pair<std::string, std::string>>& states);

/// Writes `text` to `path` atomically: a temporary file (`path` + ".tmp") in the same directory,
/// fsync, rename, fsync of the directory. Throws Error naming the file.
void write_file_atomically(const std::string& path, const std::string& text);

/// Checks that `checkpoint` continues the sample order of `sampler`'s run (the same seed, shuffle,
/// drop_last and data set; the same global batch world × batch_size, whatever the world) and lies
/// inside a run of `epochs` epochs (some batch is left to run; every finished_ahead entry is a
/// batch of the run; steps plus the run's batches fit 64 bits), and returns where this rank
/// starts. Throws ConfigError naming the field, both values or the allowed range, `where` first
/// (the manifest's path).
ResumePoint resume_point(const Checkpoint& checkpoint, const Sampler& sampler, std::uint32_t epochs,
                         const std::string& where);

/// The cursor of a rank whose batches before `next` (its sequence index) all finished, and
/// `ahead` (indices after `next`) too.
Checkpoint make_checkpoint(const Sampler& sampler, std::uint64_t next,
                           const std::vector<std::uint64_t>& ahead, std::uint64_t steps);

/// `path` with every `{rank}` replaced by `rank` (one checkpoint directory per rank of a job).
std::string expand_rank(std::string path, int rank);

}  // namespace flowfeed
