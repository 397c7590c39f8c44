// Bootstrap from the environment: precedence of the launcher families, malformed values, defaults
// under mpirun/srun, and a rendezvous started from such a configuration.
#include <cstdlib>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "engine/comm/bootstrap.hpp"
#include "engine/core/error.hpp"
#include "test_util.hpp"

using namespace tandem;
using namespace tandem::engine::comm;
using namespace std::chrono_literals;

namespace {

using Env = std::map<std::string, std::string>;

EnvLookup lookup_in(const Env& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

BootstrapConfig parse(const Env& env) { return bootstrap_config_from_env(lookup_in(env)); }

// Message of the kInvalidArgument error `env` must produce ("" when none).
std::string invalid(const Env& env) {
  try {
    parse(env);
  } catch (const Error& e) {
    if (e.status() != Status::kInvalidArgument) return std::string("wrong status: ") + e.what();
    return e.what();
  }
  return "";
}

// Sets/unsets real environment variables for one scope and restores them afterwards.
class ScopedEnv {
 public:
  void set(const std::string& k, const std::string& v) {
    save(k);
    ::setenv(k.c_str(), v.c_str(), 1);
  }
  void unset(const std::string& k) {
    save(k);
    ::unsetenv(k.c_str());
  }
  ~ScopedEnv() {
    for (auto& [k, v] : saved_) {
      if (v) {
        ::setenv(k.c_str(), v->c_str(), 1);
      } else {
        ::unsetenv(k.c_str());
      }
    }
  }

 private:
  void save(const std::string& k) {
    if (saved_.count(k)) return;
    const char* v = std::getenv(k.c_str());
    saved_[k] = v ? std::optional<std::string>(v) : std::nullopt;
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

const char* kAllVars[] = {"TANDEM_RANK", "TANDEM_WORLD_SIZE", "TANDEM_LOCAL_RANK", "TANDEM_LOCAL_WORLD_SIZE",
                          "TANDEM_MASTER_ADDR", "TANDEM_MASTER_PORT", "TANDEM_SECRET", "RANK", "WORLD_SIZE",
                          "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                          "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "SLURM_PROCID", "SLURM_NTASKS",
                          "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID",
                          "SLURM_NNODES", "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES"};

const Env kAllFamilies = {
    {"TANDEM_RANK", "1"},       {"TANDEM_WORLD_SIZE", "4"},      {"TANDEM_LOCAL_RANK", "1"},
    {"TANDEM_LOCAL_WORLD_SIZE", "4"}, {"TANDEM_MASTER_ADDR", "127.0.0.1"}, {"TANDEM_MASTER_PORT", "31000"},
    {"RANK", "2"},              {"WORLD_SIZE", "5"},             {"LOCAL_RANK", "2"},
    {"LOCAL_WORLD_SIZE", "5"},  {"MASTER_ADDR", "127.0.0.2"},    {"MASTER_PORT", "32000"},
    {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "6"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
    {"OMPI_COMM_WORLD_LOCAL_SIZE", "6"}, {"SLURM_PROCID", "4"},   {"SLURM_NTASKS", "7"},
    {"SLURM_LOCALID", "4"},     {"SLURM_NTASKS_PER_NODE", "7"},
};

Env without(Env env, std::initializer_list<const char*> names) {
  for (const char* n : names) env.erase(n);
  return env;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(bootstrap_env)

BOOST_AUTO_TEST_CASE(nothing_set_means_a_single_rank) {
  const BootstrapConfig c = parse({});
  BOOST_TEST(c.info.rank == 0);
  BOOST_TEST(c.info.size == 1);
  BOOST_TEST(c.info.local_rank == 0);
  BOOST_TEST(c.info.local_size == 1);
  BOOST_TEST(c.source == "default");
  BOOST_TEST(c.master_port == 0);
  BOOST_TEST(!c.info.host.empty());
  const Rendezvous r = start_rendezvous(c, 1000ms);  // no server, no client: an in-memory store
  BOOST_TEST(!r.server);
  BOOST_TEST(!r.client);
  r.store->set("k", "v");
  BOOST_TEST(r.store->get("k", 0ms) == "v");
}

BOOST_AUTO_TEST_CASE(families_apply_in_precedence_order) {
  Env env = kAllFamilies;
  BootstrapConfig c = parse(env);
  BOOST_TEST(c.source == "TANDEM");
  BOOST_TEST(c.info.rank == 1);
  BOOST_TEST(c.info.size == 4);
  BOOST_TEST(c.info.local_rank == 1);
  BOOST_TEST(c.master_addr == "127.0.0.1");
  BOOST_TEST(c.master_port == 31000);

  env = without(env, {"TANDEM_RANK", "TANDEM_WORLD_SIZE", "TANDEM_LOCAL_RANK", "TANDEM_LOCAL_WORLD_SIZE"});
  c = parse(env);
  BOOST_TEST(c.source == "torchrun");
  BOOST_TEST(c.info.rank == 2);
  BOOST_TEST(c.info.size == 5);
  BOOST_TEST(c.info.local_rank == 2);
  BOOST_TEST(c.info.local_size == 5);
  BOOST_TEST(c.master_port == 31000);  // TANDEM_MASTER_* still wins over MASTER_*

  env = without(env, {"TANDEM_MASTER_ADDR", "TANDEM_MASTER_PORT"});
  c = parse(env);
  BOOST_TEST(c.master_addr == "127.0.0.2");
  BOOST_TEST(c.master_port == 32000);

  env = without(env, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"});
  c = parse(env);
  BOOST_TEST(c.source == "Open MPI");
  BOOST_TEST(c.info.rank == 3);
  BOOST_TEST(c.info.size == 6);
  BOOST_TEST(c.info.local_rank == 3);
  BOOST_TEST(c.info.local_size == 6);

  env = without(env, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                      "OMPI_COMM_WORLD_LOCAL_SIZE"});
  c = parse(env);
  BOOST_TEST(c.source == "Slurm");
  BOOST_TEST(c.info.rank == 4);
  BOOST_TEST(c.info.size == 7);
  BOOST_TEST(c.info.local_rank == 4);
  BOOST_TEST(c.info.local_size == 7);
}

BOOST_AUTO_TEST_CASE(local_values_fall_back_to_the_next_family) {
  // torchrun without LOCAL_WORLD_SIZE under mpirun: the local size comes from Open MPI.
  const BootstrapConfig c = parse({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                                   {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "1234"},
                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  BOOST_TEST(c.info.local_rank == 1);
  BOOST_TEST(c.info.local_size == 2);
  BOOST_TEST(c.master_addr == "10.1.2.3");
}

BOOST_AUTO_TEST_CASE(malformed_values_name_the_variable) {
  const Env base = {{"TANDEM_RANK", "0"}, {"TANDEM_WORLD_SIZE", "2"}, {"TANDEM_MASTER_PORT", "4000"}};
  struct Case {
    const char* var;
    const char* value;
  };
  const Case cases[] = {{"TANDEM_RANK", "abc"},        {"TANDEM_RANK", ""},          {"TANDEM_RANK", "1x"},
                        {"TANDEM_RANK", " 1"},         {"TANDEM_RANK", "-1"},        {"TANDEM_RANK", "2"},
                        {"TANDEM_WORLD_SIZE", "0"},    {"TANDEM_WORLD_SIZE", "two"}, {"TANDEM_MASTER_PORT", "0"},
                        {"TANDEM_MASTER_PORT", "70000"}, {"TANDEM_MASTER_PORT", "80a"},
                        {"TANDEM_LOCAL_RANK", "x"},    {"TANDEM_LOCAL_WORLD_SIZE", "-3"},
                        {"TANDEM_MASTER_ADDR", "bad host"}, {"TANDEM_RANK", "99999999999999999999"}};
  for (const Case& k : cases) {
    Env env = base;
    env[k.var] = k.value;
    const std::string msg = invalid(env);
    BOOST_TEST(msg.find(k.var) != std::string::npos, k.var << "='" << k.value << "' gave: '" << msg << "'");
  }
  // Half a pair is an error naming the missing half.
  BOOST_TEST(invalid({{"TANDEM_RANK", "0"}}).find("TANDEM_WORLD_SIZE") != std::string::npos);
  BOOST_TEST(invalid({{"WORLD_SIZE", "3"}}).find("RANK") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(mpirun_without_master_uses_loopback_and_a_port_from_the_job_id) {
  Env env = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"OMPI_MCA_ess_base_jobid", "1437925377"}};
  const BootstrapConfig a = parse(env);
  BOOST_TEST(a.master_addr == "127.0.0.1");
  BOOST_TEST(a.master_port >= 20000);
  BOOST_TEST(a.master_port < 32768);
  // Every derived port lies below Linux's default ephemeral range (32768-60999), where another program's client
  // connection could hold it: 2,000 job ids, the ones Open MPI hands out in a row included.
  for (int k = 0; k < 2000; ++k) {
    Env other = env;
    other["OMPI_MCA_ess_base_jobid"] = std::to_string(1437925377 + k * 65536 + (k % 7));
    const int port = parse(other).master_port;
    BOOST_TEST_REQUIRE(port >= 20000);
    BOOST_TEST_REQUIRE(port < 32768);
  }
  bool said_so = false;
  for (const auto& n : a.notes) said_so = said_so || n.find("1437925377") != std::string::npos;
  BOOST_TEST(said_so);
  env["OMPI_COMM_WORLD_RANK"] = "0";
  BOOST_TEST(parse(env).master_port == a.master_port);  // every rank of the job agrees
  env["OMPI_MCA_ess_base_jobid"] = "1437925378";
  BOOST_TEST(parse(env).master_port != a.master_port);  // another job, another port
  // No secret given: a predictable default, and a note that says so.
  bool warned = false;
  for (const auto& n : a.notes) warned = warned || n.find("TANDEM_SECRET") != std::string::npos;
  BOOST_TEST(warned);
}

BOOST_AUTO_TEST_CASE(multi_host_jobs_without_an_address_are_refused) {
  const std::string msg = invalid({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  BOOST_TEST(msg.find("MASTER_ADDR") != std::string::npos, msg);
  const std::string slurm = invalid({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "2"}});
  BOOST_TEST(slurm.find("MASTER_ADDR") != std::string::npos, slurm);
  const BootstrapConfig one_node =
      parse({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "1"}, {"SLURM_JOB_ID", "77"}});
  BOOST_TEST(one_node.master_addr == "127.0.0.1");
  BOOST_TEST(one_node.info.local_rank == 3);
  BOOST_TEST(one_node.info.local_size == 4);
}

BOOST_AUTO_TEST_CASE(rank_0_of_1_while_a_launcher_announced_more_is_refused) {
  // A wrapper that kept WORLD_SIZE but lost RANK is already an error; one that kept only a size from another
  // family, or an MPI whose rank names we do not read (MPICH's PMI_*), must not quietly make a 1-rank job.
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"}) {
    const std::string msg = invalid({{var, "4"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}});
    BOOST_TEST(msg.find(std::string(var) + "=4") != std::string::npos, msg);
    BOOST_TEST(msg.find("rank 0 of 1") != std::string::npos, msg);
  }
  BOOST_TEST(invalid({{"PMI_SIZE", "2"}}).find("no rank variables set") != std::string::npos);
  // Announcements of one rank, or nothing to read, are fine.
  BOOST_TEST(parse({{"PMI_SIZE", "1"}, {"SLURM_NTASKS", "1"}, {"SLURM_PROCID", "0"}}).info.size == 1);
  BOOST_TEST(parse({{"PMI_SIZE", "x"}}).info.size == 1);
  // Tandem's own variables are meant (tandem launch -n 1, or a size given to tandem_comm_create); more than one
  // rank resolved: other families' sizes are not second-guessed (a launch inside an allocation).
  BOOST_TEST(parse({{"TANDEM_RANK", "0"}, {"TANDEM_WORLD_SIZE", "1"}, {"WORLD_SIZE", "4"}}).info.size == 1);
  BOOST_TEST(parse({{"TANDEM_RANK", "0"}, {"TANDEM_WORLD_SIZE", "2"}, {"PMI_SIZE", "8"}}).info.size == 2);
}

BOOST_AUTO_TEST_CASE(real_environment_is_read_with_the_same_precedence) {
  ScopedEnv guard;
  for (const char* v : kAllVars) guard.unset(v);
  BOOST_TEST(bootstrap_config_from_env().info.size == 1);
  guard.set("RANK", "1");
  guard.set("WORLD_SIZE", "3");
  guard.set("MASTER_PORT", "4567");
  guard.set("TANDEM_SECRET", "s3cret");
  BootstrapConfig c = bootstrap_config_from_env();
  BOOST_TEST(c.source == "torchrun");
  BOOST_TEST(c.info.rank == 1);
  BOOST_TEST(c.secret == "s3cret");
  BOOST_TEST(c.master_port == 4567);
  guard.set("TANDEM_RANK", "2");
  guard.set("TANDEM_WORLD_SIZE", "3");
  c = bootstrap_config_from_env();
  BOOST_TEST(c.source == "TANDEM");
  BOOST_TEST(c.info.rank == 2);
  guard.set("TANDEM_RANK", "x");
  BOOST_CHECK_THROW(bootstrap_config_from_env(), Error);
}

BOOST_AUTO_TEST_CASE(rendezvous_from_env_connects_every_rank) {
  const int port = rdv_test::free_port();
  constexpr int kRanks = 3;
  std::vector<Env> envs(kRanks);
  std::vector<std::string> seen(kRanks);
  std::vector<std::thread> ts;
  for (int r = 0; r < kRanks; ++r) {
    envs[r] = {{"TANDEM_RANK", std::to_string(r)}, {"TANDEM_WORLD_SIZE", std::to_string(kRanks)},
               {"TANDEM_MASTER_ADDR", "127.0.0.1"}, {"TANDEM_MASTER_PORT", std::to_string(port)},
               {"TANDEM_SECRET", "env-secret"}};
  }
  for (int r = 0; r < kRanks; ++r) {
    ts.emplace_back([&, r] {
      try {
        // Rank 0 starts last: the others must wait for its server rather than fail.
        if (r == 0) std::this_thread::sleep_for(200ms);
        Rendezvous rdv = start_rendezvous(parse(envs[r]), 5000ms);
        if ((r == 0) != static_cast<bool>(rdv.server)) return;
        rdv.store->set("hello/" + std::to_string(r), "from " + std::to_string(r));
        for (int p = 0; p < kRanks; ++p) seen[r] += rdv.store->get("hello/" + std::to_string(p), 5000ms) + ";";
        rdv.client->barrier("done", kRanks, 5000ms);  // rank 0 keeps its server until all have read
      } catch (const std::exception& e) {
        seen[r] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < kRanks; ++r) BOOST_TEST(seen[r] == "from 0;from 1;from 2;", "rank " << r);
  // A port of 0 cannot work for several ranks: a clear error, not a hang.
  Env bad = envs[1];
  bad["TANDEM_MASTER_PORT"] = "0";
  BOOST_TEST(invalid(bad).find("TANDEM_MASTER_PORT") != std::string::npos);
}

// TANDEM_STORE (issue #17): a store served by another process (tandem launch). It applies to the rendezvous it
// names -- then rank 0 serves nothing and every rank is a client -- and a malformed value is named.
BOOST_AUTO_TEST_CASE(tandem_store_names_an_external_store_for_the_rendezvous_it_matches) {
  const Env base = {{"TANDEM_RANK", "0"}, {"TANDEM_WORLD_SIZE", "2"}, {"TANDEM_MASTER_ADDR", "127.0.0.1"},
                    {"TANDEM_MASTER_PORT", "4000"}};
  BOOST_TEST(!parse(base).external_store);
  Env env = base;
  env["TANDEM_STORE"] = "127.0.0.1:4000";
  BOOST_TEST(parse(env).external_store);
  env["TANDEM_STORE"] = "127.0.0.1:4001";  // another rendezvous (a sub-job's port): rank 0 serves its own
  BOOST_TEST(!parse(env).external_store);
  env["TANDEM_STORE"] = "10.0.0.1:4000";
  BOOST_TEST(!parse(env).external_store);
  for (const char* bad : {"127.0.0.1", ":4000", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:99999", "127.0.0.1:4x"}) {
    env["TANDEM_STORE"] = bad;
    const std::string msg = invalid(env);
    BOOST_TEST(msg.find("TANDEM_STORE") != std::string::npos, bad << " gave: '" << msg << "'");
  }
}

BOOST_AUTO_TEST_CASE(with_an_external_store_no_rank_serves_and_the_store_outlives_rank_0) {
  RendezvousServerOptions so;
  so.secret = "external-secret";
  so.every_generation = true;
  so.shutdown_grace = 0ms;
  RendezvousServer server(so);
  constexpr int kRanks = 3;
  std::vector<BootstrapConfig> configs;
  for (int r = 0; r < kRanks; ++r) {
    const Env env = {{"TANDEM_RANK", std::to_string(r)}, {"TANDEM_WORLD_SIZE", std::to_string(kRanks)},
                     {"TANDEM_MASTER_ADDR", "127.0.0.1"}, {"TANDEM_MASTER_PORT", std::to_string(server.port())},
                     {"TANDEM_SECRET", "external-secret"},
                     {"TANDEM_STORE", "127.0.0.1:" + std::to_string(server.port())}};
    configs.push_back(parse(env));
  }
  std::vector<Rendezvous> rdv;
  for (int r = 0; r < kRanks; ++r) rdv.push_back(start_rendezvous(configs[r], 5000ms));
  for (int r = 0; r < kRanks; ++r) BOOST_TEST(!rdv[r].server, "rank " << r << " serves a store of its own");
  rdv[0].store->set("from-0", "hello");
  rdv.erase(rdv.begin());  // rank 0 is gone: what it wrote, and the store, are not
  BOOST_TEST(rdv[1].store->get("from-0", 2000ms) == "hello");
  BOOST_TEST(rdv[0].store->add("survivors", 1) + rdv[1].store->add("survivors", 1) == 3);
  // A wrong secret is refused by the external store as by rank 0's.
  Env wrong = {{"TANDEM_RANK", "1"}, {"TANDEM_WORLD_SIZE", "2"}, {"TANDEM_MASTER_ADDR", "127.0.0.1"},
               {"TANDEM_MASTER_PORT", std::to_string(server.port())}, {"TANDEM_SECRET", "wrong"},
               {"TANDEM_STORE", "127.0.0.1:" + std::to_string(server.port())}};
  Status st = Status::kOk;
  try {
    start_rendezvous(parse(wrong), 2000ms);
  } catch (const Error& e) {
    st = e.status();
  }
  BOOST_TEST((st == Status::kAuth));
}

BOOST_AUTO_TEST_SUITE_END()
