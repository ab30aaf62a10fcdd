// `--set key.path=value` overrides: applied to the parsed YAML document before it is read, so an
// overridden value is converted and checked like a written one; messages about it name the
// override instead of a file position.

#include <algorithm>
#include <sstream>

#include "detail/config_yaml.hpp"
#include "detail/text.hpp"

namespace flowfeed::detail {

void apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides,
                     std::map<std::string, std::string>& canonical,
                     std::vector<std::string>& errors) {
  for (const auto& text : overrides) {
    auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
      errors.push_back("--set " + text + ": expected key.path=value");
      continue;
    }
    std::string path = text.substr(0, eq);
    std::string value = text.substr(eq + 1);
    std::vector<std::string> keys;
    std::stringstream ss(path);
    for (std::string k; std::getline(ss, k, '.');) keys.push_back(k);
    if (std::find(keys.begin(), keys.end(), "") != keys.end()) {
      errors.push_back("--set " + text + ": empty key in '" + path + "'");
      continue;
    }
    YAML::Node parsed;
    try {
      parsed = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      errors.push_back("--set " + text + ": value is not valid YAML (" + e.msg + ")");
      continue;
    }
    std::string canon;
    YAML::Node cur = root;
    bool ok = true;
    std::size_t first_key = 0;
    if (keys[0] == "nodes") {
      // Nodes are addressed by name: nodes.NAME.key...
      YAML::Node nodes = root["nodes"];
      std::vector<std::string> names;
      bool found = false;
      if (keys.size() >= 2 && nodes.IsSequence()) {
        for (std::size_t n = 0; n < nodes.size(); ++n) {
          if (!nodes[n].IsMap()) continue;  // reported by validation
          YAML::Node name = nodes[n]["name"];
          if (name.IsScalar()) names.push_back(name.Scalar());
          if (name.IsScalar() && name.Scalar() == keys[1]) {
            cur.reset(nodes[n]);
            canon = "nodes[" + std::to_string(n) + "]";
            found = true;
            break;
          }
        }
      }
      if (keys.size() < 3) {
        errors.push_back("--set " + text + ": name a node and one of its keys (e.g. nodes." +
                         (keys.size() == 2 ? keys[1] : std::string("load")) + ".concurrency=2)");
        continue;
      }
      if (!found) {
        std::string hint = closest(keys[1], names);
        errors.push_back(
            "--set " + text + ": no node named '" + keys[1] + "'" +
            (hint.empty() ? " (nodes: " + join(names) + ")" : " (did you mean '" + hint + "'?)"));
        continue;
      }
      first_key = 2;
    }
    for (std::size_t i = first_key; i < keys.size() && ok; ++i) {
      canon += (canon.empty() ? "" : ".") + keys[i];
      if (i + 1 == keys.size()) {
        cur[keys[i]] = parsed;
      } else {
        YAML::Node next = cur[keys[i]];
        if (!next.IsDefined() || next.IsNull()) {
          cur[keys[i]] = YAML::Node(YAML::NodeType::Map);
          next = cur[keys[i]];
        }
        if (!next.IsMap()) {
          errors.push_back("--set " + text + ": '" + keys[i] + "' is not a map");
          ok = false;
          break;
        }
        cur.reset(next);
      }
    }
    if (ok) canonical[canon] = text;
  }
}

}  // namespace flowfeed::detail
