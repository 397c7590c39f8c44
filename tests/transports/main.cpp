#define BOOST_TEST_MODULE tandem_transports
#include <boost/test/unit_test.hpp>
