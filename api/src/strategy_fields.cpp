// The strategy fields' readers (strategy_fields.hpp).
#include "api/src/strategy_fields.hpp"

#include <array>
#include <string>

#include <fmt/format.h>

#include "engine/core/error.hpp"

namespace tandem::api {
namespace {

namespace par = engine::parallel;

struct Reader {
  std::string_view field;
  const char* readers;                 // for the message
  bool (*reads)(par::Strategy, bool);  // easgd_async as the second argument
};

bool servers(par::Strategy s, bool easgd_async) { return par::has_servers(s, easgd_async); }
bool ssp(par::Strategy s, bool) { return s == par::Strategy::kSsp; }
bool ps_async(par::Strategy s, bool) { return s == par::Strategy::kPsAsync; }
bool easgd(par::Strategy s, bool) { return s == par::Strategy::kEasgd; }
bool fedavg(par::Strategy s, bool) { return s == par::Strategy::kFedAvg; }
bool localsgd(par::Strategy s, bool) { return s == par::Strategy::kLocalSgd; }

constexpr const char* kServers = "strategies ps, ps-async, ssp and easgd with easgd_async";
constexpr std::array<Reader, 13> kReaders{{
    {"servers", kServers, servers},
    {"staleness", "strategy ssp", ssp},
    {"staleness_lr", "strategy ps-async", ps_async},
    {"tau", "strategy easgd", easgd},
    {"alpha", "strategy easgd", easgd},
    {"easgd_async", "strategy easgd", easgd},
    {"clients", "strategy fedavg", fedavg},
    {"dirichlet_alpha", "strategy fedavg", fedavg},
    {"client_fraction", "strategy fedavg", fedavg},
    {"local_epochs", "strategy fedavg", fedavg},
    {"round_deadline_s", "strategy fedavg", fedavg},
    {"average_every", "strategy localsgd", localsgd},
    {"warmup_steps", "strategy localsgd", localsgd},
}};

}  // namespace

void require_read(par::Strategy s, bool easgd_async, std::initializer_list<std::string_view> fields,
                  std::string_view prefix, std::string_view bit) {
  std::string names;
  const Reader* reader = nullptr;
  for (std::string_view f : fields) {
    const Reader* r = nullptr;
    for (const Reader& x : kReaders)
      if (x.field == f) r = &x;
    TANDEM_CHECK(r != nullptr && (reader == nullptr || r->reads == reader->reads), Status::kInternal,
                 "require_read: '{}' is not a strategy field read like the others given with it", f);
    reader = r;
    names += fmt::format("{}{}{}", names.empty() ? "" : ", ", names.empty() ? prefix : "", f);
  }
  TANDEM_CHECK(reader != nullptr, Status::kInternal, "require_read: no field");
  TANDEM_REQUIRE(reader->reads(s, easgd_async), "{} ({}) {} read by {} only, not by {}{} (leave {} unset)", names,
                 bit, fields.size() > 1 ? "are" : "is", reader->readers, par::strategy_name(s),
                 s == par::Strategy::kEasgd && reader->reads == servers ? " without easgd_async (its centre is all-reduced)"
                                                                        : "",
                 fields.size() > 1 ? "them" : "it");
}

void require_clients_fit(int64_t clients, int64_t samples, std::string_view prefix) {
  TANDEM_REQUIRE(clients <= samples,
                 "{}clients = {} is more than the {} training samples: every FedAvg client needs at least one", prefix,
                 clients, samples);
}

}  // namespace tandem::api
