#define BOOST_TEST_MODULE tandem_core
#include <boost/test/unit_test.hpp>
