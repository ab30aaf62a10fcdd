#include "flowfeed/mlp/mlp_node.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "flowfeed/extend.hpp"
#include "flowfeed/gauge.hpp"
#include "flowfeed/nodes/all_reduce.hpp"
#include "flowfeed/nodes/dataset.hpp"
#include "flowfeed/nodes/idx.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

namespace {

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

std::string param_where(const NodeSpec& spec, const std::string& key) {
  SourceLoc loc = spec.params.loc(key);
  return (loc.file.empty() ? spec.loc : loc).str();
}

}  // namespace

MlpNode::MlpNode(MlpNodeOptions options, std::string node_name, SourceLoc loc)
    : options_(std::move(options)), name_(std::move(node_name)), loc_(std::move(loc)) {
  if (!options_.eval_images.empty()) {
    IdxDataset d = load_idx_dataset(options_.eval_images, options_.eval_labels, options_.classes);
    eval_.count = d.count;
    eval_.features = d.rows * d.cols;
    eval_.images = std::move(d.images);
    eval_.labels.assign(d.labels.begin(), d.labels.end());
  }
}

MlpNode::~MlpNode() = default;

MlpNodeOptions MlpNode::options_from(const NodeSpec& spec) {
  const Params& p = spec.params;
  MlpNodeOptions o;
  o.hidden.clear();
  for (std::int64_t h : p.get_int_list("hidden")) o.hidden.push_back(static_cast<int>(h));
  o.classes = static_cast<int>(p.get_int("classes"));
  o.lr = p.get_number("lr");
  o.momentum = p.get_number("momentum");
  o.seed = static_cast<std::uint64_t>(p.get_int("seed"));
  if (p.has("eval_images")) o.eval_images = p.get_string("eval_images");
  if (p.has("eval_labels")) o.eval_labels = p.get_string("eval_labels");
  o.eval_every = static_cast<int>(p.get_int("eval_every"));
  o.steps_ahead = static_cast<int>(p.get_int("steps_ahead"));
  o.all_reduce = p.get_string("all_reduce");
  if (p.has("nccl_id_file")) o.nccl_id_file = p.get_string("nccl_id_file");
  o.collective_timeout_s = p.get_number("collective_timeout_s");
  if (o.eval_images.empty() != o.eval_labels.empty()) {
    const std::string set = o.eval_images.empty() ? "eval_labels" : "eval_images";
    const std::string missing = o.eval_images.empty() ? "eval_images" : "eval_labels";
    throw ConfigError({param_where(spec, set) + ": nodes." + spec.name + ".params." + missing +
                       ": missing (" + set + " is set, and evaluation needs both files) set " +
                       missing + " too, or neither"});
  }
  return o;
}

void MlpNode::setup(BuildContext& context) {
  const std::string where = loc_.str() + ": nodes." + name_;
  if (context.replicas() > 1) {
    throw ConfigError({where +
                       ".type: mlp does not train on several pipeline.devices in one "
                       "process (its " +
                       std::to_string(context.replicas()) +
                       " branches would each update their own weights; averaging gradients "
                       "across branches is not implemented) run one process per GPU with "
                       "mpirun or torchrun and all_reduce: nccl, each with one device_id"});
  }
  const BatchLayout& layout = context.layout();
  const int xi = layout.find("x");
  const int yi = layout.find("y");
  if (xi < 0 || yi < 0) {
    throw ConfigError({where + ".type: mlp needs tensors x and y from the loader (it gives " +
                       std::to_string(layout.tensors().size()) +
                       " tensors without both names) use a loader such as idx or npy"});
  }
  const TensorSpec& x = layout.tensors()[static_cast<std::size_t>(xi)];
  const TensorSpec& y = layout.tensors()[static_cast<std::size_t>(yi)];
  if (x.dtype != DType::float32 && x.dtype != DType::uint8) {
    throw ConfigError({where + ".type: mlp takes x as float32 or uint8, the loader gives " +
                       std::string(dtype_name(x.dtype)) +
                       " (convert the data, or set the "
                       "loader's dtype)"});
  }
  if (y.dtype != DType::int32 || y.sample_elements() != 1) {
    throw ConfigError({where +
                       ".type: mlp takes y as one int32 label per sample, the loader "
                       "gives " +
                       std::string(dtype_name(y.dtype)) + " with " +
                       std::to_string(y.sample_elements()) + " elements"});
  }

  MlpSetup s;
  s.model.inputs = static_cast<int>(x.sample_elements());
  s.model.hidden = options_.hidden;
  s.model.classes = options_.classes;
  s.model.lr = static_cast<float>(options_.lr);
  s.model.momentum = static_cast<float>(options_.momentum);
  s.model.seed = options_.seed;
  s.device_id = context.device_id();
  s.batch_size = context.batch_size();
  s.steps_ahead = options_.steps_ahead;
  s.x_u8 = x.dtype == DType::uint8;
  s.x_index = static_cast<std::size_t>(xi);
  s.y_index = static_cast<std::size_t>(yi);
  s.x_sample_bytes = x.sample_bytes();
  if (eval_.count > 0) {
    if (eval_.features != x.sample_elements()) {
      throw DataError(options_.eval_images + ": test images have " +
                      std::to_string(eval_.features) + " pixels each but the training samples " +
                      std::to_string(x.sample_elements()) +
                      " (evaluate on images of the training shape)");
    }
    s.eval = &eval_;
  }
  const auto* data = dynamic_cast<const InMemoryDataset*>(&context.loader());
  if (data && data->resident()) {
    if (!context.ordered()) {
      throw ConfigError({where + ".type: resident training takes batches in the sampler's order "
                                 "(pipeline.ordered is false) set pipeline.ordered: true"});
    }
    resident_ = true;
    s.resident = data;
    s.dataset_size = context.loader().size();
    s.sampler = std::make_unique<Sampler>(context.sampler_options(), s.dataset_size,
                                          context.batch_size(), context.loader().shard_starts());
  }
  s.parallel = data_parallel(context, where);
  transport_ = s.parallel.transport;
  epochs_ = context.epochs();
  loss_gauge_ = &context.gauge("loss");
  if (eval_.count > 0) accuracy_gauge_ = &context.gauge("test_accuracy");
  if (context.backend() == Backend::cuda) {
#if FLOWFEED_WITH_CUDA
    backend_ = make_mlp_cuda_backend(std::move(s));
    backend_name_ = "cuda";
#else
    throw ConfigError({where + ".type: the cuda backend is unavailable in this build "
                               "(reconfigure with -DFLOWFEED_CUDA=ON)"});
#endif
  } else {
    backend_ = make_mlp_cpu_backend(std::move(s));
    backend_name_ = "host";
  }
}

DataParallel MlpNode::data_parallel(BuildContext& context, const std::string& where) const {
  DataParallel d;
  const SamplerOptions& so = context.sampler_options();
  d.rank = so.rank;
  d.world = so.world;
  d.nccl_id_file = options_.nccl_id_file;
  d.timeout_s = options_.collective_timeout_s;
  const bool cuda = context.backend() == Backend::cuda;
  d.transport = options_.all_reduce;
  if (d.transport == "auto") d.transport = d.world == 1 ? "none" : cuda ? "nccl" : "mpi";
  if (d.transport == "none") return d;
  const std::string key = where + ".params.all_reduce: ";
  if (d.transport == "nccl" && !cuda) {
    throw ConfigError({key + "nccl runs on the cuda backend (this pipeline runs on host) use "
                             "all_reduce: mpi under mpirun, or device: cuda"});
  }
  if (d.transport == "mpi" && cuda) {
    throw ConfigError({key + "mpi is the host backend's transport (this pipeline runs on cuda) "
                             "use all_reduce: nccl"});
  }
  if (d.transport == "mpi" && !mpi::launched()) {
    throw ConfigError({key + "mpi needs a job launched by Open MPI's mpirun (" +
                       std::to_string(d.world) +
                       " ranks, but OMPI_COMM_WORLD_SIZE is not set) launch with mpirun, or set "
                       "all_reduce: none to train one model per rank"});
  }
  // Every rank must take part in every step's all-reduce: the same number of batches each.
  const std::size_t size = context.loader().size();
  const std::size_t batch = context.batch_size();
  std::vector<std::size_t> shards;
  for (int r = 0; r < d.world; ++r) {
    SamplerOptions other = so;
    other.rank = r;
    Sampler sampler(other, size, batch);
    if (sampler.batches_per_epoch() != Sampler(so, size, batch).batches_per_epoch()) {
      throw ConfigError({where +
                         ".type: data-parallel training needs the same number of steps "
                         "on every rank, but rank " +
                         std::to_string(r) + " has " + std::to_string(sampler.batches_per_epoch()) +
                         " batches per epoch and rank " + std::to_string(so.rank) + " " +
                         std::to_string(Sampler(so, size, batch).batches_per_epoch()) + " (" +
                         std::to_string(size) + " samples over " + std::to_string(d.world) +
                         " ranks in batches of " + std::to_string(batch) +
                         ") set sampler.drop_last: true, or a batch size that divides the shards"});
    }
    shards.push_back(sampler.shard_size());
  }
  d.global_rows = [shards, batch](std::size_t index) {
    std::size_t rows = 0;
    for (std::size_t shard : shards) {
      const std::size_t first = index * batch;
      rows += first < shard ? std::min(batch, shard - first) : 0;
    }
    return rows;
  };
  return d;
}

void MlpNode::begin_run() {
  if (transport_ != "none") mpi::run_started();
  epochs_report_.clear();
  steps_ = epoch_steps_ = 0;
  t_epoch_ns_ = 0;
  eval_seconds_ = 0;
  last_loss_ = last_accuracy_ = test_loss_ = test_accuracy_ = -1;
  if (backend_) backend_->begin_run();
}

void MlpNode::process(Batch& batch) {
  if (epoch_steps_ == 0 && t_epoch_ns_ == 0) t_epoch_ns_ = now_ns();
  backend_->step(batch);
  ++steps_;
  ++epoch_steps_;
}

void MlpNode::end_epoch(std::uint32_t epoch) {
  const StepStats train = backend_->take_train_stats();
  const std::uint64_t t_end = now_ns();
  const double seconds = t_epoch_ns_ ? static_cast<double>(t_end - t_epoch_ns_) * 1e-9 : 0.0;
  std::map<std::string, double> row;
  row["epoch"] = epoch + 1;
  row["steps"] = static_cast<double>(epoch_steps_);
  row["seconds"] = seconds;
  row["steps_per_second"] = seconds > 0 ? static_cast<double>(epoch_steps_) / seconds : 0.0;
  if (train.samples > 0) {
    last_loss_ = train.loss_sum / static_cast<double>(train.samples);
    last_accuracy_ = static_cast<double>(train.correct) / static_cast<double>(train.samples);
    row["loss"] = last_loss_;
    row["accuracy"] = last_accuracy_;
    if (loss_gauge_) loss_gauge_->set(last_loss_);
  }
  const bool last = static_cast<int>(epoch) + 1 == epochs_;
  if (eval_.count > 0 && (last || (options_.eval_every > 0 &&
                                   (static_cast<int>(epoch) + 1) % options_.eval_every == 0))) {
    const std::uint64_t t0 = now_ns();
    const StepStats test = backend_->evaluate();
    eval_seconds_ += static_cast<double>(now_ns() - t0) * 1e-9;
    test_loss_ = test.loss_sum / static_cast<double>(test.samples);
    test_accuracy_ = static_cast<double>(test.correct) / static_cast<double>(test.samples);
    row["test_loss"] = test_loss_;
    row["test_accuracy"] = test_accuracy_;
    if (accuracy_gauge_) accuracy_gauge_->set(test_accuracy_);
  }
  epochs_report_.push_back(std::move(row));
  epoch_steps_ = 0;
  t_epoch_ns_ = now_ns();
}

void MlpNode::quiesce() noexcept {
  if (backend_) backend_->quiesce();
}

void MlpNode::finish(RunReport& report) {
  if (transport_ != "none") mpi::run_finished();
  report.train.loss = last_loss_;
  report.train.accuracy = test_accuracy_ >= 0 ? test_accuracy_ : last_accuracy_;
  report.train.test_loss = test_loss_;
  const double train_seconds = report.seconds - eval_seconds_;
  report.train.steps_per_second =
      train_seconds > 0 ? static_cast<double>(steps_) / train_seconds : 0.0;
  report.train.epochs = epochs_report_;
  report.extra["train_eval_seconds"] = eval_seconds_;
  if (backend_) backend_->finish(report);
}

void register_mlp(Registry& registry) {
  Schema schema;
  schema.add_int_list("hidden", "widths of the ReLU hidden layers", std::vector<std::int64_t>{256})
      .range(1, 1 << 20);
  schema.add_int("classes", "output classes; labels must be below this", 10).range(1, 1 << 20);
  schema.add_number("lr", "SGD learning rate", 0.05).range(1e-12, 1e6);
  schema.add_number("momentum", "heavy-ball momentum in [0, 1)", 0.0).range(0, 0.999999);
  schema.add_int("seed", "weight initialisation seed (the same weights on CPU and GPU)", 1)
      .range(0, 9.2e18);
  schema.add_string("eval_images",
                    "IDX test images, evaluated every eval_every epochs and at "
                    "the end");
  schema.add_string("eval_labels", "IDX test labels (with eval_images)");
  schema.add_int("eval_every", "evaluate after every N-th epoch (and after the last)", 1)
      .range(1, 1e9);
  schema
      .add_int("steps_ahead",
               "cuda: most steps the host enqueues before it waits for the "
               "device (bounds run-ahead so stall_fraction reflects device time)",
               2)
      .range(1, 1024);
  schema
      .add_string("all_reduce",
                  "data-parallel gradient exchange: auto (none for one rank, else mpi on host, "
                  "nccl on cuda), none (one model per rank), mpi, nccl",
                  std::string("auto"))
      .one_of({"auto", "none", "mpi", "nccl"});
  schema.add_string("nccl_id_file",
                    "nccl without mpirun: rank 0 writes the NCCL id to this path, the other "
                    "ranks read it (a fresh path per job)");
  schema
      .add_number("collective_timeout_s",
                  "most seconds a rank waits for the others (id file, NCCL init, a step's "
                  "all-reduce) before the run fails",
                  300.0)
      .range(0.001, 1e6);
  registry.set(factory_type(
      "mlp", Role::train, std::move(schema),
      [](const NodeSpec& spec) {
        return std::make_unique<MlpNode>(MlpNode::options_from(spec), spec.name, spec.loc);
      },
      "multilayer perceptron (ReLU, softmax cross-entropy, SGD with momentum): the CPU "
      "reference on the host backend, cuBLAS on cuda"));
}

}  // namespace flowfeed
