#define BOOST_TEST_MODULE tandem_comm
#include <boost/test/unit_test.hpp>
