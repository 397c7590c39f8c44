#define BOOST_TEST_MODULE tandem_parallel
#include <boost/test/unit_test.hpp>
