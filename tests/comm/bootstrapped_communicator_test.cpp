// BootstrappedCommunicator: forwards to its communicator and keeps the rendezvous (here: its store)
// alive as long as it or any split of it lives.
#include <boost/test/unit_test.hpp>

#include "engine/comm/bootstrapped_communicator.hpp"
#include "tests/comm/comm_harness.hpp"

using namespace tandem;
using namespace tandem::testing;
using namespace tandem::engine::comm;

BOOST_AUTO_TEST_SUITE(bootstrapped_communicator)

BOOST_AUTO_TEST_CASE(the_rendezvous_outlives_every_split) {
  std::weak_ptr<transports::KvStore> watch;
  std::unique_ptr<Communicator> child;
  {
    auto store = std::make_shared<transports::MemoryStore>();
    watch = store;
    CommOptions o;
    o.transport = "inproc";
    auto inner = Communicator::create(BootstrapInfo{}, store, o);
    Rendezvous rdv;
    rdv.store = store;
    store.reset();
    BootstrappedCommunicator comm(std::move(rdv), std::move(inner));
    BOOST_TEST(comm.rank() == 0);
    BOOST_TEST(comm.size() == 1);
    BOOST_TEST(std::string(comm.transport_name()) == "inproc");
    float x = 2.f, y = 0.f;
    comm.allreduce(&x, &y, 1, DType::kF32, ReduceOp::kSum)->wait();
    BOOST_TEST(y == 2.f);
    BOOST_TEST(comm.split(-1, 0) == nullptr);
    child = comm.split(0, 0);
    auto* wrapped = dynamic_cast<BootstrappedCommunicator*>(child.get());
    BOOST_REQUIRE(wrapped != nullptr);
    BOOST_TEST(wrapped->rendezvous().store == comm.rendezvous().store);
  }
  BOOST_TEST(!watch.expired());  // the child still holds it
  int32_t one = 1, n = 0;
  child->allreduce(&one, &n, 1, DType::kI32, ReduceOp::kSum)->wait();
  BOOST_TEST(n == 1);
  child.reset();
  BOOST_TEST(watch.expired());
}

BOOST_AUTO_TEST_CASE(failures_are_the_inner_communicators) {
  CommOptions o;
  o.transport = "inproc";
  BootstrappedCommunicator comm(Rendezvous{}, Communicator::create(BootstrapInfo{}, nullptr, o));
  BOOST_TEST(!comm.is_failed());
  comm.abort("done here");
  BOOST_TEST(comm.is_failed());
  const auto f = comm.failure_status();
  BOOST_TEST(f.aborted);
  BOOST_TEST(f.origin == 0);
  BOOST_TEST(comm.failure_message().find("done here") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
