#pragma once
// Which strategy reads each strategy field of tandem_parallel_params_t and tandem_sim_job_params_t (the same names in
// both, and the job JSON's keys): one rule for the trainer and the simulator. A field given to a strategy that does
// not read it was silently ignored (`--staleness 3 --strategy ps-async` trained and simulated as if it were not
// there); it is refused now, naming the field and the strategies that read it.
//
//   require_read(c.strategy, c.easgd_async, {"staleness"}, "tandem_trainer_create_parallel: parallel->",
//                "TANDEM_PARALLEL_PARAM_STALENESS");
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "engine/parallel/parallel_config.hpp"

namespace tandem::api {

// Throws kInvalidArgument when a field of `fields` ("servers", "staleness", "staleness_lr", "tau", "alpha",
// "easgd_async", "clients", "dirichlet_alpha", "client_fraction", "local_epochs", "round_deadline_s", "average_every", "warmup_steps": the
// fields one mask bit covers, all read by the same strategies) is not read by strategy `s` (with `easgd_async`:
// EASGD's variant, which decides whether it has servers). The message: `prefix` before the fields' names
// ("parallel->", "job."), then `bit` (the mask bit's name) and the strategies that read them. Any other name is a
// caller's bug (kInternal).
void require_read(engine::parallel::Strategy s, bool easgd_async, std::initializer_list<std::string_view> fields,
                  std::string_view prefix, std::string_view bit);

// FedAvg's clients each hold a share of the training samples: more clients than samples leaves some with none (their
// rounds run on nothing and weigh nothing). Throws kInvalidArgument naming `prefix`clients and both counts.
void require_clients_fit(int64_t clients, int64_t samples, std::string_view prefix);

}  // namespace tandem::api
