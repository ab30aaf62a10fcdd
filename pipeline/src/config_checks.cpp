// The checks every config value goes through, whichever way it was written (YAML, `--set`, C++),
// and the key-to-member tables of the fixed sections.

#include <algorithm>
#include <cmath>
#include <sstream>

#include "detail/config_check.hpp"
#include "detail/text.hpp"

namespace flowfeed::detail {

void Problems::add_at(const std::string& where, const std::string& path, const std::string& what) {
  // Past the first kMaxListedProblems a problem is only counted: a file of a million bad keys
  // costs a number, not a line each.
  if (lines_.size() >= ConfigError::kMaxListedProblems) {
    ++unlisted_;
    return;
  }
  std::string line = where + ": ";
  if (!path.empty()) line += path + ": ";
  line += what;
  lines_.push_back(std::move(line));
}

std::string Problems::override_at(const std::string& path) const {
  for (const auto& [p, text] : overrides_) {
    if (path == p || path.rfind(p + ".", 0) == 0 || path.rfind(p + "[", 0) == 0) {
      return "--set " + shortened(text);
    }
  }
  return "";
}

std::string Problems::where(const std::string& path, const SourceLoc& loc) const {
  if (std::string by_override = override_at(path); !by_override.empty()) return by_override;
  // A key that only an override made (e.g. `foo` from `--set foo.bar=1`) has no position.
  if (loc.line == 0) {
    for (const auto& [p, text] : overrides_) {
      if (p.rfind(path + ".", 0) == 0) return "--set " + shortened(text);
    }
  }
  return loc.str();
}

void Problems::throw_if_any() const {
  if (!lines_.empty()) throw ConfigError(lines_, unlisted_);
}

std::string format_number(double v) {
  if (std::floor(v) == v && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string range_text(const ParamSpec& spec) {
  if (spec.min && spec.max) {
    return "must be between " + format_number(*spec.min) + " and " + format_number(*spec.max);
  }
  if (spec.min) return "must be at least " + format_number(*spec.min);
  return "must be at most " + format_number(*spec.max);
}

std::string unknown_key(const std::string& key, const std::vector<std::string>& known) {
  const std::string hint = closest(key, known);
  return "unknown key" + (!hint.empty()   ? " (did you mean '" + hint + "'?)"
                          : known.empty() ? std::string(" (this takes no keys)")
                                          : " (known keys: " + join(known) + ")");
}

std::vector<std::string> key_names(const Schema& schema) {
  std::vector<std::string> names;
  for (const auto& p : schema.params()) names.push_back(p.name);
  return names;
}

namespace {

/// A value as a message quotes it.
std::string describe_value(const ParamValue& v) {
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* i = std::get_if<std::int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return format_number(*d);
  if (const auto* s = std::get_if<std::string>(&v)) return detail::quoted(*s);
  if (std::holds_alternative<std::vector<std::int64_t>>(v)) return "a list";
  if (std::holds_alternative<std::vector<std::string>>(v)) return "a list of strings";
  if (std::holds_alternative<std::vector<double>>(v)) return "a list";
  return "nothing";
}

}  // namespace

bool check_range(std::int64_t x, const ParamSpec& spec, const std::string& path,
                 const std::string& where, Problems& problems) {
  const auto d = static_cast<double>(x);
  if ((spec.min && d < *spec.min) || (spec.max && d > *spec.max)) {
    problems.add_at(where, path, std::to_string(x) + " is out of range (" + range_text(spec) + ")");
    return false;
  }
  return true;
}

bool check_range(double x, const ParamSpec& spec, const std::string& path, const std::string& where,
                 Problems& problems) {
  if ((spec.min && x < *spec.min) || (spec.max && x > *spec.max)) {
    problems.add_at(where, path, format_number(x) + " is out of range (" + range_text(spec) + ")");
    return false;
  }
  return true;
}

namespace {

/// check_range of every item of a list param (`path`[i]); all of them are checked.
template <class T>
bool check_each(const std::vector<T>& list, const ParamSpec& spec, const std::string& path,
                const std::string& where, Problems& problems) {
  bool ok = true;
  for (std::size_t i = 0; i < list.size(); ++i) {
    ok = check_range(list[i], spec, path + "[" + std::to_string(i) + "]", where, problems) && ok;
  }
  return ok;
}

}  // namespace

bool check_value(const ParamValue& v, const ParamSpec& spec, const std::string& path,
                 const std::string& where, Problems& problems) {
  auto mismatch = [&](const std::string& expected) {
    problems.add_at(where, path, "expected " + expected + ", got " + describe_value(v));
    return false;
  };
  switch (spec.type) {
    case ParamType::boolean: return std::holds_alternative<bool>(v) || mismatch("true or false");
    case ParamType::integer:
      if (const auto* i = std::get_if<std::int64_t>(&v)) {
        return check_range(*i, spec, path, where, problems);
      }
      if (const auto* s = std::get_if<std::string>(&v); s && spec.or_auto && *s == "auto") {
        return true;
      }
      return mismatch(spec.or_auto ? "an int or auto" : "an int");
    case ParamType::number:
      if (const auto* i = std::get_if<std::int64_t>(&v)) {
        return check_range(*i, spec, path, where, problems);
      }
      if (const auto* d = std::get_if<double>(&v))
        return check_range(*d, spec, path, where, problems);
      return mismatch("a number");
    case ParamType::string: {
      const auto* s = std::get_if<std::string>(&v);
      if (!s) return mismatch("a string");
      if (!spec.choices.empty() &&
          std::find(spec.choices.begin(), spec.choices.end(), *s) == spec.choices.end()) {
        const std::string hint = closest(*s, spec.choices);
        problems.add_at(where, path,
                        detail::quoted(*s) + " is not one of " + join(spec.choices, ", ") +
                            (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
        return false;
      }
      return true;
    }
    case ParamType::string_list:
      return std::holds_alternative<std::string>(v) ||
             std::holds_alternative<std::vector<std::string>>(v) ||
             mismatch("a string or a list of strings");
    case ParamType::int_list: {
      const auto* list = std::get_if<std::vector<std::int64_t>>(&v);
      return list ? check_each(*list, spec, path, where, problems) : mismatch("a list of ints");
    }
    case ParamType::number_list: {
      const auto* list = std::get_if<std::vector<double>>(&v);
      return list ? check_each(*list, spec, path, where, problems) : mismatch("a list of numbers");
    }
  }
  return false;
}

void finish_section(Params& values, const Schema& schema, const std::string& path,
                    const std::function<std::string(const std::string&)>& where,
                    const std::string& required_why, Problems& problems,
                    const std::vector<std::string>& written) {
  for (const auto& spec : schema.params()) {
    if (values.has(spec.name) ||
        std::find(written.begin(), written.end(), spec.name) != written.end()) {
      continue;
    }
    if (spec.required) {
      const std::string why = spec.doc.empty() ? required_why : spec.doc;
      const std::string key_path = path.empty() ? spec.name : path + "." + spec.name;
      problems.add_at(where(key_path), key_path,
                      "missing required key" + (why.empty() ? "" : " (" + why + ")"));
    } else if (!std::holds_alternative<std::monostate>(spec.default_value)) {
      values.set(spec.name, spec.default_value);
    }
  }
}

void check_params(NodeSpec& node, const Schema& schema, const std::string& path,
                  Problems& problems) {
  Params checked;
  const std::vector<std::string> known = key_names(schema);
  for (const auto& [key, value] : node.params.values()) {
    const std::string key_path = path + ".params." + key;
    SourceLoc loc = node.params.loc(key);
    const std::string where = loc.file.empty() ? node.loc.str() : loc.str();
    const ParamSpec* spec = schema.find(key);
    if (!spec) {
      problems.add_at(where, key_path, unknown_key(key, known));
      continue;
    }
    check_value(value, *spec, key_path, where, problems);
    checked.set(key, value, loc);
  }
  const std::string where = node.loc.str();
  finish_section(
      checked, schema, path + ".params", [&](const std::string&) { return where; }, "", problems);
  node.params = std::move(checked);
}

namespace {

std::int64_t as_int(const ParamValue& v) {
  return std::get<std::int64_t>(v);
}
ParamValue int_value(std::int64_t v) {
  return ParamValue(v);
}
/// The field of a `pipeline:` key that is an int member of PipelineOptions.
OptionField int_field(const char* key, int PipelineOptions::*member) {
  return {key,
          [member](PipelineConfig& c, const ParamValue& v) {
            c.pipeline.*member = static_cast<int>(as_int(v));
          },
          [member](const PipelineConfig& c) -> std::optional<ParamValue> {
            return int_value(c.pipeline.*member);
          }};
}
/// True for the value `auto` of a key that allows it (ParamSpec::allow_auto).
bool is_auto(const ParamValue& v) {
  const auto* s = std::get_if<std::string>(&v);
  return s && *s == "auto";
}

}  // namespace

const std::vector<OptionField>& pipeline_fields() {
  using Get = std::optional<ParamValue>;
  static const std::vector<OptionField> fields = {
      int_field("epochs", &PipelineOptions::epochs),
      {"batch_size",
       [](PipelineConfig& c, const ParamValue& v) {
         c.pipeline.batch_size = static_cast<std::size_t>(as_int(v));
       },
       // 0 means "the loader's size, else 64"; YAML cannot write it, C++ may leave it unset.
       [](const PipelineConfig& c) -> Get {
         if (c.pipeline.batch_size == 0) return std::nullopt;
         return int_value(static_cast<std::int64_t>(c.pipeline.batch_size));
       }},
      {"prefetch_depth",
       [](PipelineConfig& c, const ParamValue& v) {
         c.pipeline.auto_prefetch_depth = is_auto(v);
         if (!is_auto(v)) c.pipeline.prefetch_depth = static_cast<int>(as_int(v));
       },
       [](const PipelineConfig& c) -> Get {
         if (c.pipeline.auto_prefetch_depth) return ParamValue(std::string("auto"));
         return int_value(c.pipeline.prefetch_depth);
       }},
      {"ordered",
       [](PipelineConfig& c, const ParamValue& v) { c.pipeline.ordered = std::get<bool>(v); },
       [](const PipelineConfig& c) -> Get { return ParamValue(c.pipeline.ordered); }},
      {"device",
       [](PipelineConfig& c, const ParamValue& v) {
         const auto& d = std::get<std::string>(v);
         c.pipeline.device = d == "cuda"   ? DeviceChoice::cuda
                             : d == "host" ? DeviceChoice::host
                                           : DeviceChoice::automatic;
       },
       [](const PipelineConfig& c) -> Get {
         return ParamValue(std::string(c.pipeline.device == DeviceChoice::cuda   ? "cuda"
                                       : c.pipeline.device == DeviceChoice::host ? "host"
                                                                                 : "auto"));
       }},
      int_field("device_id", &PipelineOptions::device_id),
      {"devices",
       [](PipelineConfig& c, const ParamValue& v) {
         for (std::int64_t id : std::get<std::vector<std::int64_t>>(v)) {
           c.pipeline.devices.push_back(static_cast<int>(id));
         }
       },
       [](const PipelineConfig& c) -> Get {
         if (c.pipeline.devices.empty()) return std::nullopt;
         return ParamValue(
             std::vector<std::int64_t>(c.pipeline.devices.begin(), c.pipeline.devices.end()));
       }},
      int_field("threads", &PipelineOptions::threads),
      int_field("thread_budget", &PipelineOptions::thread_budget),
      {"stall_timeout_s",
       [](PipelineConfig& c, const ParamValue& v) {
         c.pipeline.stall_timeout_s = std::get<double>(v);
       },
       [](const PipelineConfig& c) -> Get { return ParamValue(c.pipeline.stall_timeout_s); }},
      {"on_error",
       [](PipelineConfig& c, const ParamValue& v) {
         c.pipeline.on_error = std::get<std::string>(v) == "skip" ? OnError::skip : OnError::fail;
       },
       [](const PipelineConfig& c) -> Get {
         return ParamValue(std::string(c.pipeline.on_error == OnError::skip ? "skip" : "fail"));
       }},
      int_field("max_skipped", &PipelineOptions::max_skipped),
      {"mode",
       [](PipelineConfig& c, const ParamValue& v) {
         c.pipeline.mode = std::get<std::string>(v) == "pull" ? RunMode::pull : RunMode::run;
       },
       [](const PipelineConfig& c) -> Get {
         return ParamValue(std::string(c.pipeline.mode == RunMode::pull ? "pull" : "run"));
       }},
      {"resume_from",
       [](PipelineConfig& c, const ParamValue& v) {
         c.pipeline.resume_from = std::get<std::string>(v);
       },
       [](const PipelineConfig& c) -> Get {
         if (c.pipeline.resume_from.empty()) return std::nullopt;
         return ParamValue(c.pipeline.resume_from);
       }},
  };
  return fields;
}

const std::vector<OptionField>& sampler_fields() {
  using Get = std::optional<ParamValue>;
  static const std::vector<OptionField> fields = {
      {"shuffle",
       [](PipelineConfig& c, const ParamValue& v) { c.sampler.shuffle = std::get<bool>(v); },
       [](const PipelineConfig& c) -> Get { return ParamValue(c.sampler.shuffle); }},
      {"seed",
       [](PipelineConfig& c, const ParamValue& v) {
         c.sampler.seed = static_cast<std::uint64_t>(as_int(v));
       },
       // A seed above INT64_MAX would wrap negative; clamp it so the range message shows it large.
       [](const PipelineConfig& c) -> Get {
         return int_value(static_cast<std::int64_t>(
             std::min<std::uint64_t>(c.sampler.seed, static_cast<std::uint64_t>(INT64_MAX))));
       }},
      {"drop_last",
       [](PipelineConfig& c, const ParamValue& v) { c.sampler.drop_last = std::get<bool>(v); },
       [](const PipelineConfig& c) -> Get { return ParamValue(c.sampler.drop_last); }},
      {"rank",
       [](PipelineConfig& c, const ParamValue& v) { c.sampler.rank = static_cast<int>(as_int(v)); },
       [](const PipelineConfig& c) -> Get { return int_value(c.sampler.rank); }},
      {"world",
       [](PipelineConfig& c, const ParamValue& v) {
         c.sampler.world = static_cast<int>(as_int(v));
       },
       [](const PipelineConfig& c) -> Get { return int_value(c.sampler.world); }},
      {"order",
       [](PipelineConfig& c, const ParamValue& v) {
         c.sampler.order =
             std::get<std::string>(v) == "shards" ? SampleOrder::shards : SampleOrder::samples;
       },
       [](const PipelineConfig& c) -> Get {
         return ParamValue(
             std::string(c.sampler.order == SampleOrder::shards ? "shards" : "samples"));
       }},
      {"shuffle_window",
       [](PipelineConfig& c, const ParamValue& v) {
         c.sampler.shuffle_window = static_cast<int>(as_int(v));
       },
       [](const PipelineConfig& c) -> Get { return int_value(c.sampler.shuffle_window); }},
  };
  return fields;
}

const std::vector<NodeField>& node_fields() {
  static const std::vector<NodeField> fields = {
      {"name", [](NodeSpec& n, const ParamValue& v) { n.name = std::get<std::string>(v); },
       [](const NodeSpec& n) { return ParamValue(n.name); }},
      {"type",
       [](NodeSpec& n, const ParamValue& v) {
         n.type = n.declared_type = std::get<std::string>(v);
       },
       [](const NodeSpec& n) { return ParamValue(n.type); }},
      {"concurrency",
       [](NodeSpec& n, const ParamValue& v) {
         n.auto_concurrency = is_auto(v);
         if (!is_auto(v)) n.concurrency = static_cast<int>(as_int(v));
       },
       [](const NodeSpec& n) {
         return n.auto_concurrency ? ParamValue(std::string("auto")) : int_value(n.concurrency);
       }},
      {"streams", [](NodeSpec& n, const ParamValue& v) { n.streams = static_cast<int>(as_int(v)); },
       [](const NodeSpec& n) { return int_value(n.streams); }},
  };
  return fields;
}

}  // namespace flowfeed::detail
