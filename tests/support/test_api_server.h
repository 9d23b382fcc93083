// A local HTTPS server standing in for the Kubernetes API server, for what the daemon sends it
// about its Node: GET/PATCH/PUT of the Node and POST/PATCH/PUT of Events in namespace default.
// As strict as the real one about those requests, and answering as it does (a metav1.Status
// body with its reason):
//  * authentication: `Authorization: Bearer <the token in token_file()>`; another token is 401
//    Unauthorized, no bearer token at all is the anonymous user, 403 Forbidden (the real one
//    with --anonymous-auth on, its default; a bad token is never taken for anonymous);
//  * a PATCH's Content-Type (parameters after ';' aside) is one of application/json-patch+json,
//    merge-patch+json, strategic-merge-patch+json, apply-patch+yaml, else 415, before anything
//    else is looked at; a POST's is application/json (the real one also takes YAML and
//    protobuf, which nothing here sends), else 415;
//  * a body that is not JSON, or a merge or strategic-merge patch that is not a JSON object, is
//    400 BadRequest; a JSON patch (RFC 6902) that cannot be applied is 422;
//  * every stored object carries metadata.resourceVersion, new on every write; a PUT or PATCH
//    whose object (after the patch) carries another one is 409 Conflict; none is unconditional;
//  * a POST must carry a complete Event (422 Invalid otherwise) with a fresh name (409
//    AlreadyExists); a PATCH must name an Event that exists (404 NotFound once it expired).
// Server-side apply (apply-patch+yaml with a fieldManager) is not implemented: 501, said so.
#ifndef EDGEACCEL_TESTS_SUPPORT_TEST_API_SERVER_H_
#define EDGEACCEL_TESTS_SUPPORT_TEST_API_SERVER_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "fixture_host.h"

namespace httplib {
class SSLServer;
}

namespace edgeaccel::testing {

// Writes DIR/NAME.crt and DIR/NAME.key: a self-signed certificate for CN 127.0.0.1 with
// `subject_alt_name`, made with the openssl command. False if openssl failed.
bool MakeSelfSignedCertificate(const std::string& dir, const std::string& name,
                               const std::string& subject_alt_name = "IP:127.0.0.1");

class TestApiServer {
 public:
  // Serves node `node_name` on 127.0.0.1 with a fresh self-signed certificate.
  explicit TestApiServer(std::string node_name = "node-1");
  ~TestApiServer();

  int port() const { return port_; }
  std::string url() const { return "https://127.0.0.1:" + std::to_string(port_); }
  std::string ca_file() const { return dir_.path() + "/server.crt"; }
  std::string token_file() const { return dir_.path() + "/token"; }

  // Every Event stored now (as the API server holds them).
  std::vector<nlohmann::json> Events();
  // Waits (up to `timeout`) until an Event with `reason` whose message contains `text` is
  // stored with at least `count`; returns it, or null.
  nlohmann::json WaitForEvent(const std::string& reason, const std::string& text, int count = 1,
                              absl::Duration timeout = absl::Seconds(10));
  int event_posts();
  int event_patches();
  // Answers every Event POST with this status (0: accept).
  void RefuseEventsWith(int status);
  // Forgets every stored Event, as their 1-hour lifetime ends.
  void ExpireEvents();

 private:
  TempDir dir_;
  const std::string node_name_;
  std::unique_ptr<httplib::SSLServer> server_;
  std::thread thread_;
  int port_ = 0;
  absl::Mutex mu_;
  nlohmann::json node_ ABSL_GUARDED_BY(mu_);
  nlohmann::json events_ ABSL_GUARDED_BY(mu_) = nlohmann::json::object();
  std::string token_;  // what a request must carry as its bearer token
  uint64_t revision_ ABSL_GUARDED_BY(mu_) = 1;  // the last resourceVersion given (etcd's revision)
  int posts_ ABSL_GUARDED_BY(mu_) = 0;
  int patches_ ABSL_GUARDED_BY(mu_) = 0;
  int refuse_with_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_TEST_API_SERVER_H_
