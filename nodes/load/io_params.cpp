// The I/O params of a file loader (`io`, `read_bytes`, `queue_depth`, `direct`, `io_async`,
// `io_fallback`): their schema and the IoOptions they give.
#include <cstdint>
#include <string>

#include "flowfeed/nodes/detail/io_engine.hpp"
#include "flowfeed/schema.hpp"

namespace flowfeed {

void add_io_params(Schema& schema) {
  schema
      .add_string("io",
                  "how files are read: pread (one read at a time per loader call), io_uring "
                  "(queue_depth reads in flight per batch) or mmap (copies from the files mapped "
                  "read-only once, no system call per read; a file truncated while mapped kills "
                  "the process)",
                  std::string("pread"))
      .one_of({"pread", "io_uring", "mmap"});
  schema.add_int("read_bytes", "the most bytes one read asks for", std::int64_t{1} << 20)
      .range(4096, 1 << 30);
  schema.add_int("queue_depth", "io_uring: reads in flight per batch", 32).range(1, 4096);
  schema.add_bool("direct",
                  "open files with O_DIRECT: reads bypass the page cache (the 4 KiB-aligned part "
                  "of each read; heads and tails go through the cache)",
                  false);
  schema.add_bool("io_async",
                  "one batch's reads through the page cache are copied in parallel: io_uring "
                  "hands them to the kernel's worker threads (IOSQE_ASYNC); pread reads them in "
                  "pieces of read_bytes as tasks on the pipeline's threads",
                  false);
  schema.add_bool("io_fallback",
                  "when io_uring or O_DIRECT is unavailable (kernel, seccomp, file system): log "
                  "it and read with pread / through the page cache (true) or fail (false)",
                  true);
}

IoOptions io_options_from(const Params& params) {
  IoOptions o;
  const std::string& io = params.get_string("io");
  o.engine = io == "io_uring" ? IoOptions::Engine::io_uring
             : io == "mmap"   ? IoOptions::Engine::mmap
                              : IoOptions::Engine::pread;
  o.read_bytes = static_cast<std::size_t>(params.get_int("read_bytes"));
  o.queue_depth = static_cast<int>(params.get_int("queue_depth"));
  o.direct = params.get_bool("direct");
  o.fallback = params.get_bool("io_fallback");
  o.async = params.get_bool("io_async");
  return o;
}

const char* io_engine_name(IoOptions::Engine engine) noexcept {
  switch (engine) {
    case IoOptions::Engine::io_uring: return "io_uring";
    case IoOptions::Engine::mmap: return "mmap";
    case IoOptions::Engine::pread: break;
  }
  return "pread";
}

}  // namespace flowfeed
