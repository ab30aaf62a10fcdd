#include "http_body.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <string_view>

namespace flowfeed::remote {

namespace {

/// Writes `bytes` at `at` of the sink's file; false (write_error set) when it cannot take them.
bool write_at(Sink& sink, const char* data, std::size_t bytes, std::uint64_t at) {
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pwrite(sink.fd, data + done, bytes - done, static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      sink.write_error = n < 0 ? errno : EIO;
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

bool flush(Sink& sink) {
  std::vector<char>& pending = *sink.pending;
  if (!write_at(sink, pending.data(), pending.size(), sink.offset - pending.size())) return false;
  pending.clear();
  return true;
}

std::size_t write_body(char* data, std::size_t size, std::size_t count, void* user) {
  auto& sink = *static_cast<Sink*>(user);
  const std::size_t bytes = size * count;
  if (!sink.checked) {
    sink.checked = true;
    long status = 0;
    curl_easy_getinfo(sink.curl, CURLINFO_RESPONSE_CODE, &status);
    sink.to_file = sink.fd >= 0 && (status == 200 || status == 206);
    if (sink.to_file && status == 200 && sink.start > 0) {
      // The server ignored the Range header: the body starts at byte 0.
      sink.offset = 0;
      if (::ftruncate(sink.fd, 0) != 0) {
        sink.write_error = errno;
        return 0;
      }
    }
  }
  if (!sink.to_file) {
    if (sink.text.size() + bytes > sink.text_limit) {
      if (!sink.truncate) return 0;
      sink.text.append(data, sink.text_limit - sink.text.size());
      sink.full = true;
      return 0;
    }
    sink.text.append(data, bytes);
    return bytes;
  }
  if (sink.offset + bytes > sink.limit) {
    sink.write_error = EFBIG;
    return 0;
  }
  std::vector<char>& pending = *sink.pending;
  for (std::size_t done = 0; done < bytes;) {
    const std::uint64_t boundary = (sink.offset / kBodyWriteAlign + 1) * kBodyWriteAlign;
    const std::size_t piece =
        static_cast<std::size_t>(std::min<std::uint64_t>(bytes - done, boundary - sink.offset));
    pending.insert(pending.end(), data + done, data + done + piece);
    sink.offset += piece;
    done += piece;
    if (sink.offset == boundary && !flush(sink)) return 0;
  }
  sink.received += bytes;
  return bytes;
}

void fresh_sink(Sink& sink, void* curl, Sink settings) {
  sink = std::move(settings);
  sink.curl = static_cast<CURL*>(curl);
  curl_easy_setopt(sink.curl, CURLOPT_WRITEFUNCTION, write_body);
  curl_easy_setopt(sink.curl, CURLOPT_WRITEDATA, &sink);
}

ContentRange content_range(CURL* curl) {
  ContentRange r;
  curl_header* h = nullptr;
  if (curl_easy_header(curl, "Content-Range", 0, CURLH_HEADER, -1, &h) != CURLHE_OK || !h) {
    return r;
  }
  std::string_view v = h->value;
  auto number = [&v](std::uint64_t& out) {
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    if (ec != std::errc() || end == v.data()) return false;
    v.remove_prefix(static_cast<std::size_t>(end - v.data()));
    return true;
  };
  auto skip = [&v](char c) {
    if (v.empty() || v.front() != c) return false;
    v.remove_prefix(1);
    return true;
  };
  if (v.substr(0, 6) != "bytes ") return r;
  v.remove_prefix(6);
  if (!skip('*')) {
    if (!number(r.first) || !skip('-') || !number(r.last) || r.last < r.first) return r;
    r.has_range = true;
  }
  if (!skip('/')) return r;
  if (!skip('*')) {
    std::uint64_t total = 0;
    if (!number(total)) return r;
    r.total = total;
  }
  r.valid = v.empty();
  return r;
}

}  // namespace flowfeed::remote
