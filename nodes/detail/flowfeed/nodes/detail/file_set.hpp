#pragma once
/// \file
/// A data set's files named by a list of paths and glob patterns, expanded once into a stable
/// order (for sharded data sets: `features: data/train-*.npy`).

#include <memory>
#include <string>
#include <vector>

#include "flowfeed/remote/remote_files.hpp"

namespace flowfeed {

/// Expands `patterns` into the files they name, in a stable order: the patterns in the order
/// given; braces first, as in a shell or a WebDataset URL (`train-{000..009}.tar`: a range of
/// integers, zero-padded to the width of a bound written with a leading zero, counting up or down;
/// `{a,b}`: each alternative in order; nested braces expand too; a brace without a matching `}`
/// or a `,`/`..` inside is kept as written); then the matches of each glob pattern (`*`, `?`,
/// `[...]`) sorted by byte value (name shards with zero-padded numbers: train-00009 before
/// train-00010). A pattern without glob characters names one file as it is. Every file is checked
/// up front: a pattern that matches nothing, a file that does not exist or cannot be opened for
/// reading, anything but a regular file (a directory, a FIFO, a device, a socket: DataFile), and a
/// file named twice throw DataError naming it, e.g. `data/train-*.npy: matches no file` or
/// `data/train-3.npy: cannot open (Permission denied)`. `what` (e.g. "features") starts the
/// message of an empty list. Thread-safe.
std::vector<std::string> expand_file_set(const std::vector<std::string>& patterns,
                                         const std::string& what);

/// Where a loader's URLs go: its remote params, and the RemoteFiles made at the first URL (it
/// keeps the fetched shards in the cache while the loader lives).
struct RemoteSource {
  RemoteOptions options;
  std::shared_ptr<RemoteFiles> files;
  /// expand_file_set lists the URLs but fetches nothing: they stay in the list as written, for
  /// the loader to fetch (at build, or streamed during the run).
  bool defer = false;
};

class Schema;
class Params;
/// Declares the remote params a file loader shares (cache_dir, cache_bytes, transfers, attempts,
/// timeout_s).
void add_remote_params(Schema& schema);
/// Declares `access` (fetch or range, default fetch) for files named by URL; `range_reads` says
/// what access: range reads by Range requests.
void add_access_param(Schema& schema, const std::string& range_reads);
/// RemoteOptions from validated params (declared by add_remote_params).
RemoteOptions remote_options_from(const Params& params);

/// `message` with every local path of a shard `remote` fetched replaced by the shard's URL, so
/// that an error about a cached copy names what the user wrote. `message` itself without remote.
std::string name_urls(const RemoteFiles* remote, std::string message);

struct RunReport;
/// Adds what `remote` fetched while the loader `node` was built to the report's extra figures:
/// `<node>.remote_shards`, `remote_cache_hits`, `remote_bytes_fetched`, `remote_retries`,
/// `remote_fetch_seconds` and `remote_evicted_bytes`. Nothing when `remote` is null (no URL).
void report_remote(const std::shared_ptr<RemoteFiles>& remote, const std::string& node,
                   RunReport& report);

/// expand_file_set, where a pattern may also be a URL (`https://host/train-{000..009}.tar`,
/// `s3://bucket/train-*.tar`; docs/REMOTE.md): braces expand as for paths, an s3 glob is matched
/// against the bucket's listing, and the shards are fetched into the cache; the local paths of
/// the cached copies take the URLs' places. Local files and URLs may be mixed. With `remote`
/// null a URL is a DataError.
std::vector<std::string> expand_file_set(const std::vector<std::string>& patterns,
                                         const std::string& what, RemoteSource* remote);

/// True when `pattern` holds a glob character (`*`, `?` or `[`).
bool is_glob_pattern(const std::string& pattern) noexcept;

/// The patterns that the braces of `pattern` stand for, in order (`a{1..3}` → a1, a2, a3); the
/// pattern itself when it has none. Throws DataError naming the pattern when a range, or all its
/// braces together (counted before any name is made), would give more than a million names.
std::vector<std::string> expand_braces(const std::string& pattern);

}  // namespace flowfeed
