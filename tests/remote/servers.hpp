#pragma once
// Loopback servers for the remote tests: nginx (Debian's, as this user, a temporary prefix and
// `daemon off`), the S3 protocol server and the fault-injecting proxy (Python, stdlib only).
// Each listens on 127.0.0.1 at a port chosen at run time and is killed (its process group) when
// the object goes, also when the test fails.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace flowfeed::remote_test {

/// A port free on 127.0.0.1 now (bound, then released).
inline int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(s);
    throw std::runtime_error("no free port");
  }
  ::close(s);
  return ntohs(a.sin_port);
}

inline bool accepts(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

/// A child process in its own process group, killed with it.
class Child {
 public:
  /// Starts `argv`; when `port_line`, reads "port N" from its stdout (20 s at most).
  Child(const std::vector<std::string>& argv, bool port_line) {
    int out[2];
    if (::pipe(out) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::close(out[1]);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);
    ::close(out[1]);
    fd_ = out[0];
    if (!port_line) return;
    std::string line;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      char buf[64];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, static_cast<std::size_t>(n));
    }
    if (line.rfind("port ", 0) != 0) {
      stop();
      throw std::runtime_error(argv[0] + std::string(" did not start: '") + line + "'");
    }
    port_ = std::stoi(line.substr(5));
  }
  ~Child() { stop(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  int port() const noexcept { return port_; }
  void set_port(int port) { port_ = port; }
  void stop() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGTERM);
      for (int i = 0; i < 100; ++i) {
        if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
          pid_ = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (pid_ > 0) {
        ::kill(-pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
      }
    }
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  int port_ = 0;
};

inline std::string script(const char* name) {
  return std::string(FLOWFEED_SOURCE_DIR) + "/tests/remote/" + name;
}

/// nginx serving `root` on 127.0.0.1 (`work`: a directory for its config, logs and temp files).
class Nginx {
 public:
  Nginx(const std::string& root, const std::string& work) : work_(work) {
    std::filesystem::create_directories(work);
    for (int attempt = 0; attempt < 5; ++attempt) {
      const int port = free_port();
      {
        std::ofstream conf(work + "/nginx.conf");
        // As root (a container), the workers would otherwise run as nobody and could not read
        // a private temporary directory.
        if (::geteuid() == 0) conf << "user root root;\n";
        conf << "daemon off;\nworker_processes 1;\npid " << work << "/nginx.pid;\n"
             << "error_log " << work << "/error.log;\nevents { worker_connections 512; }\n"
             << "http {\n  log_format sent '$body_bytes_sent $request_method $http_range';\n  "
                "access_log "
             << work << "/access.log sent;\n  sendfile on;\n  keepalive_requests 100000;\n"
             << "  client_body_temp_path " << work << "/body;\n  proxy_temp_path " << work
             << "/proxy;\n  fastcgi_temp_path " << work << "/fastcgi;\n  uwsgi_temp_path " << work
             << "/uwsgi;\n  scgi_temp_path " << work << "/scgi;\n"
             << "  server {\n    listen 127.0.0.1:" << port << ";\n    root " << root
             << ";\n  }\n}\n";
      }
      child_ = std::make_unique<Child>(
          std::vector<std::string>{"/usr/sbin/nginx", "-p", work, "-e", work + "/error.log", "-c",
                                   work + "/nginx.conf"},
          false);
      for (int i = 0; i < 250 && !accepts(port); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (accepts(port)) {
        child_->set_port(port);
        return;
      }
      child_.reset();
    }
    throw std::runtime_error("nginx did not start (see " + work + "/error.log)");
  }
  int port() const { return child_->port(); }
  /// The body bytes nginx has sent, over every request it has finished.
  std::uint64_t body_bytes_sent() const {
    std::ifstream log(work_ + "/access.log");
    std::uint64_t total = 0;
    std::string method, range;
    for (std::uint64_t bytes = 0; log >> bytes >> method >> range;) total += bytes;
    return total;
  }
  /// The requests nginx has finished, in order: "METHOD RANGE" each (RANGE "-" without one).
  std::vector<std::string> requests() const {
    std::ifstream log(work_ + "/access.log");
    std::vector<std::string> out;
    std::string bytes, method, range;
    while (log >> bytes >> method >> range) out.push_back(method + " " + range);
    return out;
  }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port()) + "/" + path;
  }

 private:
  std::string work_;
  std::unique_ptr<Child> child_;
};

/// The Python servers: tests/remote/s3_server.py and fault_proxy.py, with their arguments.
inline std::unique_ptr<Child> python_server(const char* name, std::vector<std::string> args) {
  args.insert(args.begin(), {FLOWFEED_PYTHON, "-u", script(name)});
  return std::make_unique<Child>(args, true);
}

/// fault_proxy.py in front of `upstream` (it forwards to its port) with `args` (faults, rates).
inline std::unique_ptr<Child> fault_proxy(const Nginx& upstream, std::vector<std::string> args) {
  args.insert(args.begin(), {"--upstream", std::to_string(upstream.port())});
  return python_server("fault_proxy.py", std::move(args));
}

/// The URL of the root of the HTTP server `server` runs: objects are named after it.
inline std::string base_url(const Child& server) {
  return "http://127.0.0.1:" + std::to_string(server.port()) + "/";
}

}  // namespace flowfeed::remote_test
