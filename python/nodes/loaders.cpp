// The Python loaders: `python` (map-style: fn(index) -> sample, or fn(indices) -> batch) and
// `python_iterable` (samples in order from an iterator). Both write rows straight into the pool
// lease and take the GIL once per Python call.
#include "loaders.hpp"

#include <fmt/format.h>

#include <flowfeed/config.hpp>
#include <flowfeed/error.hpp>
#include <flowfeed/pool.hpp>
#include <flowfeed/stats.hpp>
#include <numeric>

namespace flowfeed::python {

PythonLoaderBase::PythonLoaderBase(LoaderOptions options)
    : options_(std::move(options)), writer_(options_.tensors) {}

void PythonLoaderBase::setup(BuildContext& context) {
  const PipelineOptions& pipeline = context.pipeline_options();
  skip_ = pipeline.on_error == OnError::skip;
  drops_.set_who(fmt::format("node '{}' ({})", context.spec().name, context.spec().type));
  max_skipped_ = pipeline.max_skipped;
  cancelled_ = &context.cancelled();
  tier_ = context.output().tier;
  pool_ = &context.make_fill_pool(tier_ == Tier::staging ? "staging" : "host");
}

void PythonLoaderBase::begin_run() {
  drops_.reset();
}

std::vector<std::byte*> PythonLoaderBase::bases(Batch& batch) const {
  std::vector<std::byte*> out;
  for (std::size_t i = 0; i < options_.tensors.size(); ++i) out.push_back(batch.tensor(tier_, i));
  return out;
}

void PythonLoaderBase::check_cancelled() const {
  if (cancelled_ && cancelled_->load(std::memory_order_relaxed)) {
    throw RunCancelled("the run is being cancelled");
  }
}

void PythonLoaderBase::settle(Batch& batch, std::vector<RowFailure>& failures) {
  if (failures.empty()) return;
  if (!skip_) {
    const RowFailure& first = failures.front();
    throw DataError(sample_failure(batch.samples[first.row], first.message));
  }
  drops_.drop_rows(batch, tier_, failures, max_skipped_);
}

void PythonLoaderBase::finish(RunReport& report) {
  drops_.finish(report);
}

std::string sample_failure(std::uint64_t index, const std::string& what) {
  return "sample " + std::to_string(index) + ": " + what;
}

// ---- python: map-style

PythonMapLoader::PythonMapLoader(LoaderOptions options, PyRef fn)
    : PythonLoaderBase(std::move(options)), fn_(std::move(fn)) {}

void PythonMapLoader::process(Batch& batch) {
  batch.lease(tier_) = pool_->acquire();
  const std::vector<std::byte*> at = bases(batch);
  if (options_.batched) {
    check_cancelled();
    BodyGil gil;
    try {
      py::list indices(batch.rows());
      for (std::size_t r = 0; r < batch.rows(); ++r) {
        PyList_SET_ITEM(indices.ptr(), static_cast<py::ssize_t>(r),
                        PyLong_FromUnsignedLong(batch.samples[r]));
      }
      py::object out = fn_.get()(indices);
      writer_.write_batch(out, at, batch.rows());
    } catch (const py::error_already_set& e) {
      throw DataError(fmt::format("samples {}..: {}", batch.samples.front(), python_failure(e)));
    } catch (const std::exception& e) {
      throw DataError(fmt::format("samples {}..: {}", batch.samples.front(), e.what()));
    }
    return;
  }
  std::vector<RowFailure> failures;
  // One hold for the batch's calls: a GIL handed over between every two samples costs more than
  // a cheap callable does once several bodies want it (the interpreter still switches threads
  // inside a long call, and the copies of large arrays release it).
  {
    BodyGil gil;
    for (std::size_t r = 0; r < batch.rows(); ++r) {
      check_cancelled();
      const std::uint32_t index = batch.samples[r];
      try {
        py::object out = py::reinterpret_steal<py::object>(
            PyObject_CallOneArg(fn_.get().ptr(), py::int_(index).ptr()));
        if (!out) throw py::error_already_set();
        writer_.write_sample(out, at, r);
      } catch (const py::error_already_set& e) {
        failures.push_back({r, python_failure(e)});
      } catch (const std::exception& e) {
        failures.push_back({r, e.what()});
      }
    }
  }
  settle(batch, failures);
}

// ---- python_iterable

PythonIterableLoader::PythonIterableLoader(LoaderOptions options, PyRef source)
    : PythonLoaderBase(std::move(options)), source_(std::move(source)) {}

void PythonIterableLoader::setup(BuildContext& context) {
  PythonLoaderBase::setup(context);
  batch_size_ = context.batch_size();
}

void PythonIterableLoader::begin_run() {
  PythonLoaderBase::begin_run();
  // A run starts a new pass (a resumed run skips to its cursor below).
  BodyGil gil;
  iterator_ = PyRef();
  position_ = 0;
  ended_ = false;
  run_started_ = false;
}

py::object make_iterator(const py::object& source) {
  if (PyCallable_Check(source.ptr()) && !py::hasattr(source, "__iter__")) {
    return py::iter(source());
  }
  return py::iter(source);
}

namespace {

/// The iterator's next item, or null at its end; rethrows what it raised.
py::object next_item(const PyRef& iterator) {
  PyObject* item = PyIter_Next(iterator.get().ptr());
  if (item) return py::reinterpret_steal<py::object>(item);
  if (PyErr_Occurred()) throw py::error_already_set();
  return py::object();
}

}  // namespace

bool PythonIterableLoader::skip_to(std::uint64_t first, bool resumed) {
  while (position_ < first) {
    check_cancelled();
    if (!next_item(iterator_)) {
      if (!stream()) {
        throw DataError(
            fmt::format("the iterable ended after {} samples; each epoch takes {} (params.samples)",
                        position_, options_.samples));
      }
      if (resumed) {
        // Not a data error: skipping it would resume somewhere the checkpoint never was.
        throw Error(fmt::format(
            "the stream ended after {} samples, before sample {} of epoch {} where this run "
            "resumes (a resume reads and leaves the samples before its cursor: the iterable gave "
            "more when the checkpoint was taken) resume only from an iterable that yields the "
            "same samples again",
            position_, first, epoch_));
      }
      ended_ = true;
      return false;
    }
    ++position_;
  }
  return true;
}

void PythonIterableLoader::process(Batch& batch) {
  const std::uint64_t first = batch.samples.front();
  const bool resumed = !run_started_ && first > 0;
  run_started_ = true;
  if (stream() && ended_ && batch.epoch == epoch_ && first >= position_) {
    // Past the end of this epoch's stream: the pipeline drops the batch.
    batch.samples.clear();
    batch.end_of_data = true;
    return;
  }
  batch.lease(tier_) = pool_->acquire();
  const std::vector<std::byte*> at = bases(batch);
  std::vector<RowFailure> failures;
  BodyGil gil;
  try {
    if (!iterator_ || batch.epoch != epoch_ || first < position_) {
      // A new epoch (or a rerun) reads the iterable from its start.
      iterator_ = PyRef(make_iterator(source_.get()));
      position_ = 0;
      epoch_ = batch.epoch;
      ended_ = false;
    }
    // Samples before the batch (a resumed run's cursor) are read and left.
    if (!skip_to(first, resumed)) {
      batch.samples.clear();
      batch.end_of_data = true;
      return;
    }
    for (std::size_t r = 0; r < batch.rows(); ++r) {
      check_cancelled();
      py::object item = next_item(iterator_);
      if (!item) {
        if (!stream()) {
          throw DataError(fmt::format(
              "the iterable ended after {} samples; each epoch takes {} (params.samples)",
              position_, options_.samples));
        }
        // The end of the stream: this batch keeps the rows read (the epoch's last, maybe none),
        // its tensors moved to where a batch of that many rows has them.
        ended_ = true;
        std::vector<std::size_t> unread(batch.rows() - r);
        std::iota(unread.begin(), unread.end(), r);
        if (r > 0) {
          remove_rows(batch, tier_, unread);
        } else {
          batch.samples.clear();
        }
        batch.end_of_data = true;
        break;
      }
      ++position_;
      try {
        writer_.write_sample(item, at, r);
      } catch (const py::error_already_set& e) {
        failures.push_back({r, python_failure(e)});
      } catch (const std::exception& e) {
        failures.push_back({r, e.what()});
      }
    }
    if (stream() && !ended_ && (batch.index_in_epoch + 2) * batch_size_ > (1ull << 32)) {
      // The epoch's last batch a stream may have: its positions fit 32 bits.
      if (next_item(iterator_)) {
        throw Error(fmt::format(
            "the stream gave more than {} samples in epoch {} (flowfeed counts an epoch's "
            "samples in 32 bits) end each epoch's iterator sooner",
            position_, batch.epoch));
      }
      ended_ = true;
    }
  } catch (const py::error_already_set& e) {
    // The iterator raised: a generator is over after that, so the next batch starts a new one.
    iterator_ = PyRef();
    throw DataError(sample_failure(position_, python_failure(e)));
  } catch (const DataError&) {
    iterator_ = PyRef();
    throw;
  }
  settle(batch, failures);
}

}  // namespace flowfeed::python
