// Pipeline(config, overrides): the config's forms (a path, a FIFO, YAML text, a dict) and the
// overrides' forms, turned into a built pipeline with the Python node types registered.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <flowfeed/nodes/builtin.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "interpreter.hpp"
#include "nodes/python_nodes.hpp"
#include "registration_hook.hpp"

namespace flowfeed::python {

namespace {

std::string override_value(const py::handle& value) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>() ? "true" : "false";
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    std::string s = "[";
    bool first = true;
    for (const auto& item : value) {
      s += (first ? "" : ", ") + override_value(item);
      first = false;
    }
    return s + "]";
  }
  return py::str(value).cast<std::string>();
}

std::vector<std::string> to_overrides(const py::object& overrides) {
  std::vector<std::string> out;
  if (overrides.is_none()) return out;
  // One "key=value" string is one override (iterating it would give its characters).
  if (py::isinstance<py::str>(overrides)) return {overrides.cast<std::string>()};
  if (py::isinstance<py::dict>(overrides)) {
    for (const auto& [key, value] : overrides.cast<py::dict>()) {
      out.push_back(py::str(key).cast<std::string>() + "=" + override_value(value));
    }
    return out;
  }
  // bytes would be read one byte at a time ("--set 112: ..."), a number not at all.
  const auto type_name = [](const py::handle& o) {
    return py::str(py::type::handle_of(o).attr("__name__")).cast<std::string>();
  };
  if (py::isinstance<py::bytes>(overrides) || py::isinstance<py::bytearray>(overrides) ||
      !py::isinstance<py::iterable>(overrides)) {
    throw py::type_error(
        "overrides: expected a dict, a list of 'key.path=value' strings or one "
        "such string, got " +
        type_name(overrides));
  }
  std::size_t i = 0;
  for (const auto& item : overrides) {
    if (!py::isinstance<py::str>(item)) {
      throw py::type_error("overrides[" + std::to_string(i) +
                           "]: expected a 'key.path=value' string, got " + type_name(item));
    }
    out.push_back(item.cast<std::string>());
    ++i;
  }
  return out;
}

/// A config given as a FIFO (`Pipeline("/tmp/config.fifo")`): read here, not by load_config_file,
/// whose blocking open() would wait for a writer through Ctrl-C. The wait for the writer's data
/// gives up when a signal's Python handler raises; the read is bounded like a config file's.
/// nullopt for a path that is not a FIFO.
std::optional<std::string> read_fifo_config(const std::string& path) {
  constexpr std::size_t kLimit = std::size_t{1} << 20;  // the config reader's 1 MiB
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISFIFO(st.st_mode)) return std::nullopt;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // never blocks
  if (fd < 0) return std::nullopt;  // load_config_file says why
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_fd{fd};
  std::string text;
  bool writer_seen = false;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    ssize_t n = -1;
    int error = 0;
    {
      py::gil_scoped_release release;
      if (::poll(&p, 1, 50) > 0) {
        char buf[1 << 16];
        n = ::read(fd, buf, sizeof buf);
        error = errno;
        if (n > 0) text.append(buf, static_cast<std::size_t>(n));
      }
    }
    if (n > 0) writer_seen = true;
    // End of the data: the writer closed its end (after a writer came; before, poll waits).
    if (n == 0 && (writer_seen || (p.revents & POLLHUP))) break;
    if (n < 0 && error != EAGAIN && error != EINTR && error != 0) {
      throw ConfigError({path + ": cannot read config (" + std::strerror(error) + ")"});
    }
    if (text.size() > kLimit) {
      throw ConfigError({path +
                         ": the pipe gave more than 1.0 MiB, too large for a config (a config "
                         "holds at most 1.0 MiB; the largest example config is 2 KiB) check that "
                         "this is the config file"});
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  return text;
}

}  // namespace

std::vector<Registrar>& test_registrars() {
  static std::vector<Registrar> registrars;
  return registrars;
}

std::shared_ptr<PipelineHolder> make_pipeline(const py::object& config, const py::object& overrides,
                                              bool test_nodes) {
  auto h = std::make_shared<PipelineHolder>();
  register_builtin_nodes(h->registry);
  if (test_nodes) {
    const std::vector<Registrar>& registrars = test_registrars();
    if (registrars.empty()) {
      throw py::value_error(
          "test_nodes=True: no test node types are loaded (the module has none) import "
          "flowfeed_testing first, the test extension built in the build tree's python-testing "
          "folder");
    }
    for (Registrar registrar : registrars) registrar(h->registry);
  }
  auto callables = std::make_shared<CallableTable>();
  register_python_nodes(h->registry, callables);
  const std::vector<std::string> sets = to_overrides(overrides);
  // The Python loop is the train step: a chain without a train node needs no `mode: pull`.
  LoadDefaults defaults;
  defaults.implicit_pull = true;
  PipelineConfig parsed;
  if (py::isinstance<py::dict>(config)) {
    parsed = load_config_string(dict_config_text(config.cast<py::dict>(), *callables), h->registry,
                                sets, "<dict>", defaults);
  } else if (py::isinstance<py::str>(config) &&
             config.cast<std::string>().find('\n') != std::string::npos) {
    parsed =
        load_config_string(config.cast<std::string>(), h->registry, sets, "<string>", defaults);
  } else {
    const std::string path = py::str(py::module_::import("os").attr("fspath")(config));
    if (std::optional<std::string> text = read_fifo_config(path)) {
      parsed = load_config_string(*text, h->registry, sets, path, defaults);
    } else {
      parsed = load_config_file(path, h->registry, sets, defaults);
    }
  }
  for (const NodeSpec& node : parsed.nodes) {
    h->python_nodes = h->python_nodes || node.type.rfind("python", 0) == 0;
  }
  try {
    // Building may take long (shards fetched by URL, files indexed): other Python threads run
    // meanwhile, and Ctrl-C interrupts the transfers. Python nodes take the GIL themselves where
    // they call Python (BodyGil).
    BuildInterruptScope interrupt;
    py::gil_scoped_release nogil;
    h->pipeline.emplace(std::move(parsed), h->registry);
  } catch (...) {
    // A Ctrl-C cut the build short: KeyboardInterrupt, not the error the transfers ended with.
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    throw;
  }
  // The run ends before the interpreter does: no TBB worker may call into it afterwards.
  h->exit_key = stop_at_exit([weak = std::weak_ptr<PipelineHolder>(h)] {
    std::shared_ptr<PipelineHolder> holder = weak.lock();
    if (!holder || !holder->pipeline) return;
    holder->pipeline->request_abort();
    if (!holder->waiting) holder->end_session();
  });
  return h;
}

}  // namespace flowfeed::python
