#pragma once
/// \file
/// The member list of a tar file, read from its headers alone (the data is never read): ustar and
/// old-GNU headers, GNU long names ('L') and pax extended headers ('x': path and size).

#include <cstdint>
#include <string>
#include <vector>

namespace flowfeed {

/// One regular file inside a tar.
struct TarMember {
  std::string name;          ///< path inside the archive (a long name when one was given)
  std::uint64_t header = 0;  ///< offset of its (first) header block in the tar file
  std::uint64_t offset = 0;  ///< offset of its first data byte
  std::uint64_t size = 0;    ///< data bytes the header declares
  bool cut_short = false;    ///< the file ends before offset + size (the last member only)
};

/// A tar file's regular members, in archive order. Directories, links and other entries are
/// left out; pax global headers are ignored.
struct TarListing {
  std::vector<TarMember> members;
  std::uint64_t file_size = 0;  ///< bytes of the tar file
};

/// Reads the headers of the tar file `path` with pread, one block per member (plus its long name
/// or pax record), and never the members' data. Stops at the end-of-archive block or at the end
/// of the file; every header read lies strictly after the one before, so the work is linear in
/// the file's size. Throws DataError naming the file and the offset: "truncated tar" when the
/// file ends inside a header block, "not a tar header" when a block's checksum does not match, a
/// bad size field (not octal, or a negative base-256 number), a directory, link or other entry
/// whose size runs past the end of the file, a size whose next header would lie past 2^64. A
/// regular member whose data runs past the end of the file is kept with `cut_short` set (the
/// caller decides what a partial sample means), and ends the listing. The file must be a regular
/// file (DataFile).
TarListing read_tar_listing(const std::string& path);

}  // namespace flowfeed
