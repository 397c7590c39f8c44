#define BOOST_TEST_MODULE calibrate
#include <boost/test/unit_test.hpp>
