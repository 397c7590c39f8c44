#define BOOST_TEST_MODULE simulator
#include <boost/test/unit_test.hpp>
