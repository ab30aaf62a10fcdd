#include "flowfeed/nodes/resident.hpp"

namespace flowfeed {

PipelineConfig resident_config(const PipelineConfig& streamed, const Registry& registry) {
  if (streamed.nodes.size() < 2) {
    throw ConfigError({streamed.file + ": nodes: resident mode needs a loader and a train node"});
  }
  const NodeSpec& load = streamed.nodes.front();
  const NodeSpec& train = streamed.nodes.back();
  const NodeType* load_type = registry.find(load.type);
  std::vector<std::string> problems;
  if (!load_type || !load_type->schema.find("resident")) {
    problems.push_back(load.loc.str() + ": nodes." + load.name +
                       ".type: resident mode needs a "
                       "loader that holds the data set in memory ('" +
                       load.type + "' does not) use the idx loader");
  }
  if (train.type != "mlp") {
    problems.push_back(train.loc.str() + ": nodes." + train.name +
                       ".type: resident mode trains "
                       "with mlp ('" +
                       train.type + "' cannot take a resident data set)");
  }
  if (!problems.empty()) throw ConfigError(problems);
  PipelineConfig resident = streamed;
  resident.nodes = {load, train};
  resident.nodes.front().params.set("resident", true, {});
  validate_config(resident, registry);
  return resident;
}

}  // namespace flowfeed
