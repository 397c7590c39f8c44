#define BOOST_TEST_MODULE tandem_train
#include <boost/test/unit_test.hpp>
