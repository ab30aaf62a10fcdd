#pragma once
/// \file
/// The python_transform node (see python_nodes.hpp).

#include <atomic>
#include <flowfeed/node.hpp>
#include <memory>

#include "python_nodes.hpp"

namespace flowfeed::python {

/// `python_transform`: fn(batch) where batch is a dict of writable numpy views of the batch's
/// newest (host) buffer. None or the same dict: changed in place; another dict: its arrays, of
/// the same layout, are copied back.
class PythonTransform final : public Node {
 public:
  explicit PythonTransform(PyRef fn);
  void setup(BuildContext& context) override;
  void process(Batch& batch) override;

 private:
  PyRef fn_;
  std::unique_ptr<RowWriter> writer_;  // made in setup(), for the layout the node sees
  const std::atomic<bool>* cancelled_ = nullptr;
};

}  // namespace flowfeed::python
