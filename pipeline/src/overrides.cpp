// `--set key.path=value` overrides: applied to the parsed YAML document before it is read, so an
// overridden value is converted and checked like a written one; messages about it name the
// override instead of a file position.

#include <algorithm>
#include <sstream>

#include "detail/config_yaml.hpp"
#include "detail/text.hpp"

namespace flowfeed::detail {

namespace {

/// `text` as a message shows it: shortened, with a line break as `\n` so that one problem stays
/// one line.
std::string shown(const std::string& text) {
  std::string out;
  for (char c : shortened(text)) {
    if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

/// How to write `value` as a YAML string: `--set 'path="value"'`.
std::string quote_hint(const std::string& path, const std::string& value) {
  std::string escaped;
  for (char c : value) {
    if (c == '\\' || c == '"') escaped += '\\';
    if (c == '\n') {
      escaped += "\\n";
      continue;
    }
    escaped += c;
  }
  const std::string assignment = path + "=\"" + escaped + "\"";
  if (value.find('\'') != std::string::npos) return "quote a string value in YAML: " + assignment;
  return "quote a string value: --set '" + shortened(assignment) + "'";
}

/// Parses the value of `--set path=value` as one YAML document into `out`; false (with a problem
/// in `errors` that names the override and what is wrong with the YAML) when it is not one.
bool parse_value(const std::string& text, const std::string& path, const std::string& value,
                 YAML::Node& out, std::vector<std::string>& errors) {
  const std::string at = "--set " + text + ": ";
  try {
    const std::vector<YAML::Mark> starts = document_starts(value, 2);
    if (starts.size() > 1) {
      const auto pos = static_cast<std::size_t>(starts[1].pos);
      if (pos < value.size() && value.compare(pos, 3, "---") != 0 &&
          value.compare(pos, 3, "...") != 0) {
        // Not a document marker: the parser gave up on the value here.
        errors.push_back(at + "value is not valid YAML (unexpected '" + value.substr(pos, 1) +
                         "' after the value) " + quote_hint(path, value));
      } else {
        errors.push_back(at +
                         "the value holds a second YAML document ('---' starts another, which "
                         "would be ignored) give one value, or " +
                         quote_hint(path, value));
      }
      return false;
    }
    out = YAML::Load(value);
    return true;
  } catch (const YAML::Exception& e) {
    std::string why = e.msg;
    if (!value.empty() && value[0] == '*') why += ": '*' starts a YAML alias";
    if (!value.empty() && value[0] == '&') why += ": '&' starts a YAML anchor";
    errors.push_back(at + "value is not valid YAML (" + why + ") " + quote_hint(path, value));
    return false;
  }
}

}  // namespace

void apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides,
                     std::map<std::string, std::string>& canonical,
                     std::vector<std::string>& errors) {
  for (const auto& full_text : overrides) {
    const std::string text = shown(full_text);  // as messages quote it
    auto eq = full_text.find('=');
    if (eq == std::string::npos || eq == 0) {
      errors.push_back("--set " + text + ": expected key.path=value");
      continue;
    }
    std::string path = full_text.substr(0, eq);
    std::string value = full_text.substr(eq + 1);
    std::vector<std::string> keys;
    std::stringstream ss(path);
    for (std::string k; std::getline(ss, k, '.');) keys.push_back(k);
    if (std::find(keys.begin(), keys.end(), "") != keys.end()) {
      errors.push_back("--set " + text + ": empty key in '" + path + "'");
      continue;
    }
    YAML::Node parsed;
    if (!parse_value(text, path, value, parsed, errors)) continue;
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
