// The Python module `flowfeed`: a thin layer over pull mode (flowfeed/dlpack.hpp). Pipelines are
// built from YAML with the built-in C++ node types; batches leave as DLPack tensors.
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bindings.hpp"
#include "flowfeed/remote/remote_files.hpp"
#include "interpreter.hpp"
#include "nodes/python_nodes.hpp"

namespace flowfeed::python {

namespace {

// ---- Ctrl-C while a batch is awaited (the GIL released). The module's handler, installed in front
// of Python's own when a run starts, asks the run being waited on to stop (the second Ctrl-C: to
// abort), then hands the signal to Python's handler, which raises KeyboardInterrupt once next() is
// back. Outside next() it only hands the signal on. Installed once, so next() makes no system call
// for it (each costs microseconds under a sandboxing kernel).

std::thread::id g_main_thread;
std::atomic<PipelineHolder*> g_waiting{nullptr};
// True while the main thread builds a pipeline (BuildInterruptScope): a Ctrl-C then interrupts
// the build's transfers.
std::atomic<bool> g_building{false};
std::atomic<int> g_in_handler{0};
std::atomic<int> g_interrupts{0};
// Set while on_sigint runs: a native handler put in front of ours after we chained to it may chain
// back to us (on_sigint -> theirs -> on_sigint -> ...); the inner call returns at once. SIGINT is
// blocked while its handler runs, so only such chaining re-enters.
std::atomic<bool> g_running{false};
struct sigaction g_previous {};
// Python's own C handler for SIGINT, as it was when the module was imported: it trips the flag
// that raises KeyboardInterrupt (or runs the program's signal.signal handler).
struct sigaction g_python {};

void call_handler(const struct sigaction& h, int sig, siginfo_t* info, void* context) {
  if (h.sa_flags & SA_SIGINFO) {
    if (h.sa_sigaction) h.sa_sigaction(sig, info, context);
  } else if (h.sa_handler != SIG_DFL && h.sa_handler != SIG_IGN) {
    h.sa_handler(sig);
  }
}

bool same_handler(const struct sigaction& a, const struct sigaction& b) {
  return (a.sa_flags & SA_SIGINFO) == (b.sa_flags & SA_SIGINFO) &&
         ((a.sa_flags & SA_SIGINFO) ? a.sa_sigaction == b.sa_sigaction
                                    : a.sa_handler == b.sa_handler);
}

void on_sigint(int sig, siginfo_t* info, void* context) {
  if (g_running.exchange(true)) return;
  // Python hears of the Ctrl-C first: a run cancelled at once wakes next() at once, and next()
  // must then find KeyboardInterrupt pending (else the loop ends quietly and the interrupt is
  // raised later, anywhere).
  call_handler(g_previous, sig, info, context);
  // A native library loaded since (a CUDA or array library, say) may have put its own handler in
  // front of Python's without chaining to it: Python would then never hear of the Ctrl-C, and the
  // loop would end quietly instead of with KeyboardInterrupt. Python's handler only sets a flag,
  // so a second call is harmless.
  if (!same_handler(g_previous, g_python)) call_handler(g_python, sig, info, context);
  g_in_handler.fetch_add(1);
  if (g_building.load()) interrupt_builds();
  if (PipelineHolder* h = g_waiting.load()) {
    // Python bodies may take long per batch and the loop raises KeyboardInterrupt anyway: their
    // runs are cancelled at once (a body stops between two Python calls).
    if (g_interrupts.fetch_add(1) == 0 && !h->python_nodes) {
      h->session->request_stop();
    } else {
      h->pipeline->request_abort();
    }
  }
  g_in_handler.fetch_sub(1);
  g_running.store(false);
}

/// Puts on_sigint in front of the current SIGINT handler, unless it is there already or nothing
/// handles SIGINT (default or ignored: then Ctrl-C is left alone). Main thread only.
void install_sigint_handler() {
  if (std::this_thread::get_id() != g_main_thread) return;
  struct sigaction current {};
  if (sigaction(SIGINT, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == &on_sigint) return;
  if (!(current.sa_flags & SA_SIGINFO) &&
      (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN)) {
    return;
  }
  struct sigaction mine {};
  mine.sa_sigaction = &on_sigint;
  mine.sa_flags = SA_SIGINFO;
  sigemptyset(&mine.sa_mask);
  g_previous = current;
  sigaction(SIGINT, &mine, nullptr);
}

/// Marks `holder` as the run a Ctrl-C stops while this scope lives (the main thread waiting in it).
class SigintScope {
 public:
  explicit SigintScope(PipelineHolder* holder) {
    if (std::this_thread::get_id() != g_main_thread) return;
    g_interrupts.store(0);
    g_waiting.store(holder);
    active_ = true;
  }
  ~SigintScope() {
    if (!active_) return;
    g_waiting.store(nullptr);
    // A handler on another thread may still hold the pointer: let it finish before the holder
    // can go.
    while (g_in_handler.load() > 0) std::this_thread::yield();
  }
  SigintScope(const SigintScope&) = delete;
  SigintScope& operator=(const SigintScope&) = delete;

 private:
  bool active_ = false;
};

py::object report_dict(const RunReport& report) {
  return py::module_::import("json").attr("loads")(report.to_json());
}

/// Iterates over one epoch of the run (or, with `whole_run`, every batch left in it).
class BatchIterator {
 public:
  BatchIterator(std::shared_ptr<PipelineHolder> holder, bool whole_run)
      : cursor_(std::move(holder), whole_run) {}
  py::object next() {
    BatchHandle handle = cursor_.next();
    if (!handle) throw py::stop_iteration();
    return make_batch(cursor_.holder(), std::move(handle));
  }

 private:
  EpochCursor cursor_;
};

}  // namespace

PipelineHolder::~PipelineHolder() {
  if (exit_key >= 0) forget_at_exit(exit_key);
  peeked.release();
  if (session && PyGILState_Check()) {
    // The run drains: Python bodies still running need the GIL to finish.
    py::gil_scoped_release nogil;
    session.reset();
  }
  session.reset();
}

Pipeline& PipelineHolder::get() {
  if (!pipeline || closed) throw py::value_error("the pipeline was closed");
  return *pipeline;
}

BuildInterruptScope::BuildInterruptScope() {
  if (std::this_thread::get_id() != g_main_thread) return;
  install_sigint_handler();
  resume_builds();
  g_building.store(true);
  active_ = true;
}

BuildInterruptScope::~BuildInterruptScope() {
  if (!active_) return;
  g_building.store(false);
  while (g_in_handler.load() > 0) std::this_thread::yield();  // a handler may be setting it
  resume_builds();
}

void PipelineHolder::ensure_session() {
  check_idle();
  install_sigint_handler();
  Pipeline& p = get();
  if (session && (!session->finished() || peeked)) return;
  end_session();
  session = std::make_unique<TensorSession>(p, weak_from_this());
}

void PipelineHolder::check_idle() const {
  if (waiting) {
    throw std::runtime_error(
        "the pipeline is in use: another thread waits for its next batch (step a pipeline from "
        "one thread at a time)");
  }
}

BatchHandle PipelineHolder::next() {
  check_idle();
  if (peeked) return std::move(peeked);
  if (!session || closed) return {};
  BatchHandle handle;
  try {
    SigintScope sigint(this);
    waiting = true;
    struct Done {
      bool& flag;
      ~Done() { flag = false; }
    } done{waiting};
    py::gil_scoped_release nogil;
    handle = session->next();
  } catch (const AllBatchesHeld&) {
    throw;  // the run is intact: it goes on once the caller gives a batch back
  } catch (...) {
    // The run failed: end it now (every buffer back, its TBB worker free); the next epoch()
    // starts a new one.
    end_session();
    // A Ctrl-C cancelled it (bodies stopped mid-batch fail it): KeyboardInterrupt, not that.
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    throw;
  }
  if (PyErr_CheckSignals() != 0) {
    // KeyboardInterrupt (or another handler's exception): the run drains, then it propagates.
    handle.release();
    end_session();
    throw py::error_already_set();
  }
  return handle;
}

BatchHandle EpochCursor::next() {
  if (done_) return {};
  BatchHandle handle = holder_->next();
  if (!handle) {
    done_ = true;
    return {};
  }
  const auto epoch = static_cast<std::int64_t>(handle.batch().epoch);
  if (!whole_run_) {
    if (epoch_ < 0) epoch_ = epoch;
    if (epoch != epoch_) {
      holder_->peeked = std::move(handle);  // the next epoch starts with it
      done_ = true;
      return {};
    }
  }
  return handle;
}

void PipelineHolder::end_session() noexcept {
  peeked.release();
  if (!session) return;
  {
    py::gil_scoped_release nogil;
    session->close();
    try {
      last_report = session->report();
    } catch (...) {
    }
  }
  session.reset();
}

PYBIND11_MODULE(flowfeed, m) {
  m.doc() =
      "flowfeed: streams training batches to the GPU. Pipeline(config) builds a pull-mode "
      "pipeline from YAML; its batches' tensors leave through DLPack without copies.";
  g_main_thread = std::this_thread::get_id();
  sigaction(SIGINT, nullptr, &g_python);

  static auto error = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<ConfigError>(m, "ConfigError", error.ptr());
  py::register_exception<DataError>(m, "DataError", error.ptr());
  py::register_exception<NodeError>(m, "NodeError", error.ptr());
  py::register_exception<CudaError>(m, "CudaError", error.ptr());

  bind_batch(m);
  bind_views(m);
  install_exit_hook(m);
  // Extension modules of the same build add node types through this (registration_hook.hpp).
  static RegistrationHook hook;
  hook.add_test_registrar = [](Registrar registrar) {
    std::vector<Registrar>& registrars = test_registrars();
    if (std::find(registrars.begin(), registrars.end(), registrar) == registrars.end()) {
      registrars.push_back(registrar);
    }
  };
  m.attr("_registration_hook") = py::capsule(&hook, RegistrationHook::kCapsule);
  stop_at_exit([] { clear_registered_callables(); });
  m.def("register", &register_callable, py::arg("name"), py::arg("fn"),
        "Makes fn (a function, or a Dataset-like object with __getitem__ and __len__) available "
        "to configs as params.callable: name (replacing an earlier one of that name).");

  py::class_<BatchIterator>(m, "BatchIterator")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &BatchIterator::next);

  py::class_<PipelineHolder, std::shared_ptr<PipelineHolder>>(
      m, "Pipeline",
      "A pipeline in pull mode built from a YAML file or YAML text (the chain ends before the "
      "train role; without pipeline.mode it runs in pull mode). Iterate over epoch() or over the "
      "pipeline itself.")
      .def(py::init(&make_pipeline), py::arg("config"), py::arg("overrides") = py::none(),
           py::arg("test_nodes") = false,
           "config: a path (str or os.PathLike), YAML text (a str with a newline), or a dict with "
           "the YAML's structure (a python node's params.callable may be the object itself); "
           "overrides: {'key.path': value}, ['key.path=value', ...] or one 'key.path=value' (nodes "
           "by name: 'nodes.load.concurrency'); without pipeline.mode, a chain with no train node "
           "runs in pull mode; "
           "test_nodes: also register the test-only node types (fault_*, and late_write on CUDA "
           "builds), which the module does not contain: import flowfeed_testing (the test "
           "extension in the build tree) first.")
      .def(
          "epoch",
          [](const std::shared_ptr<PipelineHolder>& h) {
            h->ensure_session();
            return BatchIterator(h, false);
          },
          "An iterator over the next epoch's batches (a run starts when none is going).")
      .def(
          "views",
          [](const std::shared_ptr<PipelineHolder>& h, const py::object& names,
             const py::object& importer, const py::object& stream) {
            h->check_idle();
            h->get();
            return make_views(h, names, importer, stream);
          },
          py::arg("names"), py::arg("importer"), py::arg("stream") = py::none(),
          "A Views object: iterating it gives the next epoch, yielding the tensors `names` (a "
          "name, or a list of names: a tuple) already imported by `importer` (torch.from_dlpack, "
          "cupy.from_dlpack, jax.dlpack.from_dlpack, numpy.from_dlpack). Each buffer of the pool "
          "is imported once per Views object and the same tensor object comes back whenever that "
          "buffer holds the batch, so a batch costs no framework import. `stream` (an int as in "
          "__dlpack__, or a stream object with "
          "cuda_stream or ptr; None: the legacy default stream) waits on each batch's upload. A "
          "batch is held until the next one is taken (then it goes back, ordered after the work "
          "queued on `stream`; at prefetch_depth 8 or more, in groups of a quarter of it under "
          "one event): clone a tensor to keep it longer.")
      .def("__iter__",
           [](const std::shared_ptr<PipelineHolder>& h) {
             h->ensure_session();
             return BatchIterator(h, true);
           })
      .def(
          "report",
          [](PipelineHolder& h) -> py::object {
            h.check_idle();
            if (h.session) return report_dict(h.session->report());
            if (h.last_report) return report_dict(*h.last_report);
            return py::none();
          },
          "The run's report as a dict (the runner's --report JSON): of the current run so far, "
          "else of the last one; None before the first.")
      .def(
          "stop",
          [](PipelineHolder& h) {
            h.check_idle();
            h.end_session();
          },
          "Ends the current run: held batches go back (their tensors must not be read any more), "
          "in-flight ones drain.")
      .def(
          "close",
          [](PipelineHolder& h) {
            h.check_idle();
            h.closed = true;
            h.peeked.release();
            // The pools hold the bytes every batch, exported tensor (and the arrays that imported
            // one) and view points into, and each of them holds this object. Free them now only
            // when nothing but the Python Pipeline does. Else the run only stops admitting
            // batches: the ones still held keep their bytes, and the run ends and the pools go
            // with the last hold (the holder's destructor).
            if (h.weak_from_this().use_count() <= 1) {
              h.end_session();
              h.pipeline.reset();
            } else if (h.session) {
              h.session->request_stop();
            }
          },
          "Ends the run and frees the pipeline: its nodes and pools now, or, while a batch, a "
          "tensor (or an array imported from one) or a Views object taken from it is alive, once "
          "the last of them is freed (the batches they hold keep their bytes until then). The "
          "pipeline can no longer be used.")
      .def("state_dict", &state_dict,
           "The run's position and the state of the nodes that keep some, as a dict of plain "
           "values (picklable; torch.save it beside the model). Released batches count: the "
           "batches held or not taken yet come again after load_state_dict (docs/RESUME.md).")
      .def("load_state_dict", &load_state_dict, py::arg("state"),
           "Continues from a state_dict(): checked like a checkpoint (the same data set, shuffle, "
           "seed, drop_last and global batch; flowfeed.ConfigError naming the field otherwise), "
           "then every later run starts there. Before iterating, or between runs.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PipelineHolder& h, const py::object&, const py::object&, const py::object&) {
             h.check_idle();
             h.end_session();
             return false;
           })
      .def_property_readonly("free_buffers",
                             [](PipelineHolder& h) { return h.get().free_buffers(); })
      .def_property_readonly("total_buffers",
                             [](PipelineHolder& h) { return h.get().total_buffers(); })
      .def_property_readonly(
          "held", [](PipelineHolder& h) { return h.session ? h.session->held() : std::size_t{0}; },
          "Batches the caller holds (a Batch or an exported tensor still alive).")
      .def_property_readonly("epochs",
                             [](PipelineHolder& h) { return h.get().config().pipeline.epochs; })
      .def_property_readonly("prefetch_depth",
                             [](PipelineHolder& h) { return h.get().plan().prefetch_depth; })
      .def_property_readonly("backend",
                             [](PipelineHolder& h) {
                               return h.get().config().backend == Backend::cuda ? "cuda" : "host";
                             })
      .def(
          "run_pull_loop",
          [](PipelineHolder& h) {
            // The same run taken by a C++ loop (next, release), to measure what the Python layer
            // adds per batch.
            h.check_idle();
            h.end_session();
            RunReport report;
            {
              py::gil_scoped_release nogil;
              Session session = h.get().start();
              while (Batch* b = session.next()) session.release(b);
              report = session.report();
            }
            h.last_report = report;
            return report_dict(report);
          },
          "Runs the whole pipeline with a C++ pull loop (each batch taken and released at once) "
          "and returns the report: the baseline for the Python layer's cost per batch.");
}

}  // namespace flowfeed::python
