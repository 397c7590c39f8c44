#pragma once
// An in-process KvStore (mutex + condition variable): the rendezvous for ranks that are threads of
// one process (tests, the inproc transport, several devices in one process).
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "transports/transport.hpp"

namespace tandem::transports {

class MemoryStore final : public KvStore {
 public:
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> map_;
};

}  // namespace tandem::transports
