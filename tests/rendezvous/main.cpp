#define BOOST_TEST_MODULE tandem_rendezvous
#include <boost/test/unit_test.hpp>
