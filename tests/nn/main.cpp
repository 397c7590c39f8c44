#define BOOST_TEST_MODULE tandem_nn
#include <boost/test/unit_test.hpp>
