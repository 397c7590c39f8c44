// The settings registry: complete (every TANDEM_* name the sources use is registered and listed in
// tandem.h), and the snapshot's rules (unknown names, checked values, scopes).
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "engine/core/error.hpp"
#include "engine/core/settings.hpp"

namespace fs = std::filesystem;
using namespace tandem;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `body`, expecting kInvalidArgument whose message contains `needle`.
template <typename F>
void expect_invalid(F&& body, const std::string& needle) {
  try {
    body();
    BOOST_ERROR("no error; expected one mentioning " << needle);
  } catch (const Error& e) {
    BOOST_TEST((e.status() == Status::kInvalidArgument));
    BOOST_TEST(std::string(e.what()).find(needle) != std::string::npos, e.what());
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(settings_registry)

BOOST_AUTO_TEST_CASE(every_tandem_variable_in_the_sources_is_registered_and_documented) {
  // Any "TANDEM_..." string literal in library or CLI code names an environment variable (getenv,
  // a bootstrap lookup, spin_from_env...): it must be in the registry, and the registry in tandem.h.
  const fs::path root = TANDEM_SOURCE_DIR;
  const std::regex literal("\"(TANDEM_[A-Z0-9_]+)\"");
  // A literal that tandem.h #defines is an ABI constant named in a message (a strategy bit, a
  // simulator field), and one that ends in '_' is a prefix pasted to a macro argument: neither is
  // read from the environment.
  const std::string api_header = read_all(root / "api/include/tandem/tandem.h");
  const auto abi_constant = [&](const std::string& name) {
    return name.back() == '_' || std::regex_search(api_header, std::regex("#define[ \\t]+" + name + "\\b"));
  };
  std::set<std::string> unregistered;
  size_t files = 0, uses = 0, constants = 0;
  for (const char* dir : {"engine", "transports", "api/src", "cli", "simulator"}) {
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".cu" && ext != ".c" && ext != ".h"))
        continue;
      ++files;
      const std::string text = read_all(e.path());
      for (std::sregex_iterator m(text.begin(), text.end(), literal), end; m != end; ++m) {
        ++uses;
        if (abi_constant((*m)[1].str())) {
          ++constants;
          continue;
        }
        if (settings::find((*m)[1].str()) == nullptr)
          unregistered.insert((*m)[1].str() + " (" + fs::relative(e.path(), root).string() + ")");
      }
    }
  }
  BOOST_TEST(files > 100u);
  BOOST_TEST(uses - constants > 20u);  // the scan found the readers it is meant to check
  for (const auto& u : unregistered)
    BOOST_ERROR("TANDEM_* variable not in engine/core/settings.cpp's registry: " << u);

  const std::string& header = api_header;
  std::set<std::string> names;
  for (const auto& v : settings::variables()) {
    BOOST_TEST(names.insert(std::string(v.name)).second, "registered twice: " << v.name);
    BOOST_TEST(!v.meaning.empty(), v.name);
    BOOST_TEST(!v.default_text.empty(), v.name);
    BOOST_TEST(std::regex_search(header, std::regex("\\b" + std::string(v.name) + "\\b")),
               v.name << " is not listed in tandem.h's settings table");
  }
}

BOOST_AUTO_TEST_CASE(overrides_are_checked_and_unknown_names_refused) {
  settings::Settings s;
  expect_invalid([&] { s.set("TANDEM_NOT_A_SETTING", std::string("1")); }, "TANDEM_NOT_A_SETTING");
  expect_invalid([&] { s.assign("TANDEM_TIMEOUT_MS"); }, "NAME=VALUE");
  s.assign("TANDEM_TIMEOUT_MS=250");
  BOOST_TEST(*s.integer("TANDEM_TIMEOUT_MS") == 250);
  s.assign("TANDEM_TIMEOUT_MS=");  // empty: unset
  BOOST_TEST(!s.integer("TANDEM_TIMEOUT_MS").has_value());
  BOOST_TEST(s.get("TANDEM_TIMEOUT_MS") == nullptr);

  s.assign("TANDEM_ZMQ_SPIN_US=2000000");  // out of [0, 1000000]
  expect_invalid([&] { s.validate(); }, "TANDEM_ZMQ_SPIN_US='2000000'");
  expect_invalid([&] { (void)s.integer("TANDEM_ZMQ_SPIN_US"); }, "TANDEM_ZMQ_SPIN_US");
  s.assign("TANDEM_ZMQ_SPIN_US=12x");
  expect_invalid([&] { s.validate(); }, "TANDEM_ZMQ_SPIN_US='12x'");
  s.assign("TANDEM_ZMQ_SPIN_US=0");
  s.assign("TANDEM_TCP_LOCAL=udp");
  expect_invalid([&] { (void)s.text("TANDEM_TCP_LOCAL"); }, "shm|unix|tcp");
  s.assign("TANDEM_TCP_LOCAL=tcp");
  s.assign("TANDEM_MEMORY_GUARD=0");
  BOOST_TEST(*s.flag("TANDEM_MEMORY_GUARD") == false);
  s.validate();
}

BOOST_AUTO_TEST_CASE(scopes_nest_per_thread_and_fall_back_to_the_process_snapshot) {
  auto a = std::make_shared<settings::Settings>();
  a->assign("TANDEM_DATA_DIR=/a");
  auto b = std::make_shared<settings::Settings>();
  b->assign("TANDEM_DATA_DIR=/b");
  const settings::ScopedProcessValue process("TANDEM_DATA_DIR", "/process");
  BOOST_TEST(*settings::current()->text("TANDEM_DATA_DIR") == "/process");
  {
    const settings::Scope sa(a);
    BOOST_TEST(*settings::current()->text("TANDEM_DATA_DIR") == "/a");
    {
      const settings::Scope sb(b);
      BOOST_TEST(*settings::current()->text("TANDEM_DATA_DIR") == "/b");
      BOOST_TEST(std::string(settings::lookup("TANDEM_DATA_DIR")) == "/b");  // engine/comm's EnvLookup
      BOOST_TEST(settings::lookup("TANDEM_TEST_SURELY_UNSET_OTHER_NAME") == nullptr);
    }
    BOOST_TEST(*settings::current()->text("TANDEM_DATA_DIR") == "/a");
    std::string other;  // another thread does not see this thread's scope
    std::thread([&] { other = *settings::current()->text("TANDEM_DATA_DIR"); }).join();
    BOOST_TEST(other == "/process");
  }
  BOOST_TEST(*settings::current()->text("TANDEM_DATA_DIR") == "/process");
}

BOOST_AUTO_TEST_SUITE_END()
