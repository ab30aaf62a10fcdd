// pipeline_bench --record FILE: each RESULT row of the run becomes that scenario's record in a
// results file (docs/results/records.json; the format of scripts/records.py), the other records
// kept, the file replaced whole.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "bench.hpp"
#include "build_id.h"  // FLOWFEED_BUILD_ID, written at build time by build_id.cmake
#include "flowfeed/output.hpp"

namespace flowfeed::bench {

namespace {

namespace fs = std::filesystem;

/// `word` as a shell reads it back: quoted when it holds anything but plain characters.
std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of(
                                          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                          "0123456789-_./=:,+@%") == std::string::npos;
  if (plain) return word;
  std::string quoted = "'";
  for (char c : word) {
    if (c == '\'') {
      quoted.append("'\\''");
    } else {
      quoted.push_back(c);
    }
  }
  return quoted + "'";
}

/// The first line of `path` that starts with `key`, after the key and any ':' and blanks; "".
std::string field_of(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    const auto start = line.find_first_not_of(" \t:", key.size());
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

/// The records of the file at `path`, or an empty object when it does not exist.
nlohmann::json read_records(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) return nlohmann::json::object();
  // A FIFO or device would block the read or could not be replaced by a rename.
  if (!fs::is_regular_file(status)) {
    throw std::runtime_error("records file " + path +
                             " is not a regular file (a records file is replaced whole)");
  }
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read records file " + path);
  nlohmann::json data;
  try {
    data = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error("records file " + path + " is not JSON (byte " +
                             std::to_string(e.byte) + ")");
  }
  if (!data.is_object() || !data.contains("records") || !data.at("records").is_object()) {
    throw std::runtime_error("records file " + path + " is not a records file (no \"records\" " +
                             "object)");
  }
  return data.at("records");
}

}  // namespace

std::string command_line(int argc, char** argv) {
  std::string line = "pipeline_bench";  // the program's name, not where it was built
  for (int i = 1; i < argc; ++i) {
    line.push_back(' ');
    line.append(shell_word(argv[i]));
  }
  return line;
}

std::string utc_date() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[16];
  std::strftime(text, sizeof text, "%Y-%m-%d", &tm);
  return text;
}

std::string build_id() {
  return FLOWFEED_BUILD_ID;
}

std::string describe_machine() {
  std::string gpus;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    const std::string model = field_of((entry.path() / "information").string(), "Model");
    if (model.empty()) continue;
    if (!gpus.empty()) gpus.append(", ");
    gpus.append(model);
  }
  std::string cpu = field_of("/proc/cpuinfo", "model name");
  std::ostringstream host;
  host << std::thread::hardware_concurrency() << " host cores";
  if (!cpu.empty()) host << " (" << cpu << ")";
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) {
    host << ", " << std::llround(static_cast<double>(pages) * static_cast<double>(page) / (1 << 30))
         << " GiB memory";
  }
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0 && name[0] != '\0') host << ", " << name;
  return gpus.empty() ? host.str() : gpus + ", " + host.str();
}

void check_records_file(const std::string& path) {
  check_output_path(path, "records");
  read_records(path);
}

void write_records(const std::string& path, const nlohmann::json& results, const RecordRun& run) {
  if (results.empty()) return;
  nlohmann::json records = read_records(path);
  for (const auto& row : results) {
    const double baseline = row.at("baseline").get<double>();
    nlohmann::json record = {
        {"figure", row.at("figure")},
        {"unit", row.at("unit")},
        {"baseline", row.at("baseline")},
        {"ratio", baseline > 0 ? row.at("ratio") : nlohmann::json()},
        {"target", row.at("target")},
        {"command", run.command},
        {"date", run.date},
        {"build", run.build.empty() ? nlohmann::json() : nlohmann::json(run.build)},
        {"machine", run.machine}};
    if (run.build.empty()) record["missing"] = {"build"};
    records[row.at("name").get<std::string>()] = record;
  }
  const nlohmann::json file = {{"records", records}};
  write_output_file(path, file.dump(2) + "\n", "records");
}

}  // namespace flowfeed::bench
