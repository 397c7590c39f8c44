#define BOOST_TEST_MODULE tandem_compute
#include <boost/test/unit_test.hpp>
