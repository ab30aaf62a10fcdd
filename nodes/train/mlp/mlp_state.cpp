// The mlp node's checkpoint state: save_state() writes the parameters and momentum, load_state()
// reads them back and says what is missing or does not fit.
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

#include "flowfeed/mlp/mlp_node.hpp"

namespace flowfeed {

namespace {

constexpr std::string_view kStateHeader = "flowfeed mlp state 1\n";

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_floats(std::string& out, const MlpParams& p) {
  static_assert(sizeof(float) == 4);
  for (const auto* part : {&p.weights, &p.biases}) {
    for (std::size_t l = 0; l < part->size(); ++l) {
      // Weights of layer 0, 1, ... then biases: a layer's floats follow each other.
      for (float v : (*part)[l]) {
        std::uint32_t bits;
        std::memcpy(&bits, &v, 4);
        put_u32(out, bits);
      }
    }
  }
}

/// Reads save_state()'s format front to back; every shortfall names what was missing.
class StateReader {
 public:
  explicit StateReader(std::string_view in) : in_(in) {}
  std::uint32_t u32(const char* what) {
    if (in_.size() - at_ < 4) {
      throw std::runtime_error(std::string("truncated mlp state (it ends inside ") + what + ")");
    }
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      v |= static_cast<std::uint32_t>(static_cast<unsigned char>(in_[at_ + i])) << (8 * i);
    }
    at_ += 4;
    return v;
  }
  void floats(MlpParams& p, const char* what) {
    for (auto* part : {&p.weights, &p.biases}) {
      for (auto& layer : *part) {
        for (float& v : layer) {
          const std::uint32_t bits = u32(what);
          std::memcpy(&v, &bits, 4);
        }
      }
    }
  }
  void header() {
    if (in_.substr(0, kStateHeader.size()) != kStateHeader) {
      throw std::runtime_error("not an mlp state (it does not start with 'flowfeed mlp state 1')");
    }
    at_ = kStateHeader.size();
  }
  std::size_t left() const { return in_.size() - at_; }

 private:
  std::string_view in_;
  std::size_t at_ = 0;
};

}  // namespace

void MlpNode::save_state(std::string& out) const {
  if (!backend_) throw std::logic_error("MlpNode::save_state: the node is not set up");
  const MlpParams p = backend_->params();
  const MlpParams v = backend_->velocity();
  out.append(kStateHeader);
  put_u32(out, static_cast<std::uint32_t>(p.weights.size()));
  for (std::size_t l = 0; l < p.weights.size(); ++l) {
    put_u32(out, static_cast<std::uint32_t>(p.biases[l].size()));
    put_u32(out, static_cast<std::uint32_t>(p.weights[l].size() / p.biases[l].size()));
  }
  put_floats(out, p);
  put_floats(out, v);
}

void MlpNode::load_state(std::string_view state) {
  if (!backend_) throw std::logic_error("MlpNode::load_state: the node is not set up");
  StateReader in(state);
  in.header();
  MlpParams p = backend_->params();
  const std::uint32_t layers = in.u32("the layer count");
  std::string saved, ours;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> shapes;
  for (std::uint32_t l = 0; l < layers && l < 1024; ++l) {
    const std::uint32_t out = in.u32("a layer shape");
    const std::uint32_t inputs = in.u32("a layer shape");
    shapes.emplace_back(out, inputs);
    // (Appended piece by piece: gcc 12 warns, wrongly, of an overlap in " " + to_string(...).)
    if (l) saved += ' ';
    saved += std::to_string(out) + "x" + std::to_string(inputs);
  }
  for (std::size_t l = 0; l < p.weights.size(); ++l) {
    if (l) ours += ' ';
    ours += std::to_string(p.biases[l].size()) + "x" +
            std::to_string(p.weights[l].size() / p.biases[l].size());
  }
  if (saved != ours) {
    throw std::runtime_error("the saved model has layers [" + saved + "], this one [" + ours +
                             "] (out x in; another hidden, classes or input size) resume with the "
                             "same model params");
  }
  MlpParams v = p;
  in.floats(p, "the weights");
  in.floats(v, "the momentum buffers");
  if (in.left() != 0) {
    throw std::runtime_error(std::to_string(in.left()) +
                             " bytes follow the mlp state (the file is corrupt)");
  }
  backend_->set_state(p, v);
}

MlpParams MlpNode::params() const {
  if (!backend_) throw std::logic_error("MlpNode::params: the node is not set up");
  return backend_->params();
}

}  // namespace flowfeed
