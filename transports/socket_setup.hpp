#pragma once
// What the socket transports (tcp, zmq) share while connecting: the nonce a rank publishes to
// tell its peers from strays, the fields of a published address, and the ranks of one host, which
// they reach over local sockets in the abstract namespace (tcp: AF_UNIX streams; zmq:
// ipc://@name) instead of through the TCP/IP stack.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::transports {

// A fresh 64-bit nonce (std::random_device) for a rank's published address.
uint64_t random_nonce();

// This process's host id: "<boot id>:<netns dev>:<netns inode>" (hex). Processes with equal ids
// run on one boot of one kernel in one network namespace -- the scope of abstract socket names --
// so they can reach each other's local sockets; ranks in namespaces of their own (the emulated
// hosts of bench/emu, containers) get other ids and keep to TCP. Empty when it cannot be read.
std::string local_host_id();

// Reads the setting `var`: unset, empty or `on_word` turns local sockets on, "tcp" turns them off;
// anything else throws kInvalidArgument naming the variable and both words.
bool local_sockets_setting(const char* var, const char* on_word);

// Splits an address a rank published in the store at each space; empty fields are kept (so a
// doubled or trailing space shows as one and the caller refuses the address).
std::vector<std::string> address_fields(const std::string& value);

}  // namespace tandem::transports
