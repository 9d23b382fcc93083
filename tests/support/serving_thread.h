// ServingThread: answers an HttpEndpoint's or MetricsServer's requests (Listen() done) on a thread
// of the test's, named `name`, as the daemon's main thread answers them; stops the server and
// joins at its end. Declared after the server, so it ends first.
#ifndef EDGEACCEL_TESTS_SUPPORT_SERVING_THREAD_H_
#define EDGEACCEL_TESTS_SUPPORT_SERVING_THREAD_H_

#include <pthread.h>

#include <string>
#include <thread>

namespace edgeaccel::testing {

template <typename Server>
class ServingThread {
 public:
  ServingThread(Server& server, std::string name)
      : server_(server), thread_([this, name = std::move(name)] {
          pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
          (void)server_.Serve(-1);
        }) {}
  ~ServingThread() {
    server_.Stop();
    thread_.join();
  }
  ServingThread(const ServingThread&) = delete;
  ServingThread& operator=(const ServingThread&) = delete;

 private:
  Server& server_;
  std::thread thread_;
};

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_SERVING_THREAD_H_
