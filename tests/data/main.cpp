#define BOOST_TEST_MODULE tandem_data
#include <boost/test/unit_test.hpp>
