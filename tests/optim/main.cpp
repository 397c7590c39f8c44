#define BOOST_TEST_MODULE tandem_optim
#include <boost/test/unit_test.hpp>
