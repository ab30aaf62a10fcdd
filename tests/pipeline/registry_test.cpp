#include "flowfeed/registry.hpp"

#include <gtest/gtest.h>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {
// Named apart from the helpers of the test files it shares a unity group with.
namespace registry_test {

class Noop : public Node {
 public:
  void process(Batch&) override {}
};

NodeType noop_type(const std::string& name, Role role) {
  NodeType t;
  t.name = name;
  t.role = role;
  t.create = [](const NodeSpec&) { return std::make_unique<Noop>(); };
  return t;
}

TEST(Registry, AddRefusesDuplicatesSetReplaces) {
  Registry r;
  register_builtin_nodes(r);
  EXPECT_THROW(r.add(noop_type("sleep", Role::train)), std::invalid_argument);
  r.set(noop_type("sleep", Role::transform));
  EXPECT_EQ(r.find("sleep")->role, Role::transform);
  r.add(noop_type("my_sink", Role::train));
  EXPECT_NE(r.find("my_sink"), nullptr);
  EXPECT_EQ(r.find("nope"), nullptr);
  auto names = r.names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
}

TEST(Registry, UnknownTypeListsKnownOnes) {
  Registry r;
  r.add(noop_type("alpha", Role::load));
  r.add(noop_type("beta", Role::train));
  EXPECT_EQ(test::error_of<ConfigError>([&] {
              load_config_string(
                  "nodes:\n  - { name: a, type: alpah }\n  - { name: b, type: beta }\n", r, {},
                  "x.yaml");
            }),
            "x.yaml:2:22: nodes[0].type: unknown node type 'alpah' (did you mean 'alpha'? "
            "known types: alpha, beta)");
}

}  // namespace registry_test
}  // namespace
}  // namespace flowfeed
