#include "test_api_server.h"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include <httplib.h>

#include <cctype>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace edgeaccel::testing {

bool MakeSelfSignedCertificate(const std::string& dir, const std::string& name,
                               const std::string& subject_alt_name) {
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 "
                          "-addext subjectAltName=" + subject_alt_name + " -keyout " + dir + "/" +
                          name + ".key -out " + dir + "/" + name + ".crt 2>/dev/null";
  return system(cmd.c_str()) == 0;
}

ApiServerConfig ApiServerConfigFor(int port, const std::string& dir, absl::Duration timeout) {
  ApiServerConfig config;
  if (!MakeSelfSignedCertificate(dir, "ca")) return config;
  config.host = "127.0.0.1";
  config.port = port;
  config.ca_file = dir + "/ca.crt";
  config.node_name = "node-1";
  config.timeout = timeout;
  return config;
}

absl::StatusOr<HttpResponse> ReadWatch(const ApiClient& client, absl::string_view path,
                                       absl::Time deadline,
                                       const std::function<absl::Status(absl::string_view)>& on_event) {
  absl::StatusOr<std::unique_ptr<WatchStream>> stream = client.OpenWatch(path);
  if (!stream.ok()) return stream.status();
  while (true) {
    absl::StatusOr<std::optional<HttpResponse>> read = (*stream)->ReadAvailable(on_event);
    if (!read.ok()) return read.status();
    if (read->has_value()) return std::move(**read);
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) return absl::DeadlineExceededError(absl::StrCat("GET ", path, ": timed out"));
    pollfd readable{(*stream)->fd(), POLLIN, 0};
    poll(&readable, 1, static_cast<int>(std::min<int64_t>(left_ms, 1 << 30)));
  }
}

std::thread ListenInBackground(httplib::Server& server) {
  auto ended = std::make_shared<std::atomic<bool>>(false);  // a loop that could not start
  std::thread thread([&server, ended] {
    server.listen_after_bind();
    *ended = true;
  });
  while (!server.is_running() && !*ended) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return thread;
}

namespace {

using json = nlohmann::json;

// An error as the API server answers it: a metav1.Status with its reason
// (k8s.io/apimachinery/pkg/api/errors).
void Refuse(httplib::Response& res, int code, const std::string& reason,
            const std::string& message) {
  res.status = code;
  res.set_content(json{{"kind", "Status"},
                       {"apiVersion", "v1"},
                       {"metadata", json::object()},
                       {"status", "Failure"},
                       {"message", message},
                       {"reason", reason},
                       {"code", code}}
                      .dump(),
                  "application/json");
}

// The media type without parameters ("; charset=utf-8"), as the API server compares it.
std::string MediaType(const httplib::Request& req) {
  const std::string type = req.get_header_value("Content-Type");
  return type.substr(0, type.find(';'));
}

// metadata.<field> when it is a string, else "" (json::value would throw on another type).
std::string Metadata(const json& object, const char* field) {
  if (!object.is_object()) return "";
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return "";
  auto value = metadata->find(field);
  return value != metadata->end() && value->is_string() ? value->get<std::string>() : "";
}

std::string ResourceVersion(const json& object) { return Metadata(object, "resourceVersion"); }

// The optimistic lock of every update (staging/src/k8s.io/apiserver/pkg/registry/generic/
// registry/store.go, Update): an object that names a resourceVersion must name the stored one;
// nodes and events allow an update that names none. False with the 409 answered.
bool ResourceVersionMatches(const json& stored, const json& updated, const std::string& resource,
                            const std::string& name, httplib::Response& res) {
  const std::string version = ResourceVersion(updated);
  if (version.empty() || version == ResourceVersion(stored)) return true;
  Refuse(res, 409, "Conflict",
         "Operation cannot be fulfilled on " + resource + " \"" + name +
             "\": the object has been modified; please apply your changes to the latest version "
             "and try again");
  return false;
}

// Parses a request body: a JSON object, or false with the 400 answered (decoding errors are
// BadRequest: k8s.io/apiserver/pkg/endpoints/handlers, create.go and update.go).
bool ParseObject(const httplib::Request& req, json& out, httplib::Response& res) {
  out = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded() || !out.is_object()) {
    Refuse(res, 400, "BadRequest", "the request body is not a JSON object");
    return false;
  }
  return true;
}

// Applies a PATCH to `object` as k8s.io/apiserver/pkg/endpoints/handlers/patch.go does, its
// Content-Type already checked. False with the error answered.
bool ApplyPatch(const httplib::Request& req, json& object, httplib::Response& res) {
  const std::string type = MediaType(req);
  if (type == "application/apply-patch+yaml") {
    if (req.get_param_value("fieldManager").empty()) {
      Refuse(res, 400, "BadRequest", "fieldManager: Required value: is required for apply patch");
    } else {
      Refuse(res, 501, "NotImplemented",
             "the test API server does not implement server-side apply");
    }
    return false;
  }
  const json patch = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (type == "application/json-patch+json") {
    if (patch.is_discarded() || !patch.is_array()) {
      Refuse(res, 400, "BadRequest", "the JSON patch is not a list of operations");
      return false;
    }
    try {
      object = object.patch(patch);
    } catch (const json::exception& e) {
      Refuse(res, 422, "Invalid", e.what());  // patch.go: the patch does not apply
      return false;
    }
    return true;
  }
  // A merge patch (RFC 7386) or a strategic merge patch; for the fields of Nodes and Events
  // that anything here patches (maps and scalars, no lists) the two are the same. One that is
  // not a JSON object is BadRequest (jsonpatch.ErrBadJSONPatch; json.Unmarshal into a map).
  if (patch.is_discarded() || !patch.is_object()) {
    Refuse(res, 400, "BadRequest", "the patch is not a JSON object");
    return false;
  }
  object.merge_patch(patch);
  return true;
}

bool IsPatchType(const std::string& type) {
  return type == "application/json-patch+json" || type == "application/merge-patch+json" ||
         type == "application/strategic-merge-patch+json" || type == "application/apply-patch+yaml";
}

void RefuseMediaType(httplib::Response& res, const std::string& accepted) {
  Refuse(res, 415, "UnsupportedMediaType",
         "the body of the request was in an unknown format - accepted media types include: " +
             accepted);
}

constexpr char kPatchTypes[] =
    "application/json-patch+json, application/merge-patch+json, "
    "application/strategic-merge-patch+json, application/apply-patch+yaml";

}  // namespace

TestApiServer::TestApiServer(std::string node_name) : node_name_(std::move(node_name)) {
  if (!MakeSelfSignedCertificate(dir_.path(), "server")) abort();
  token_ = "secret-token";
  std::ofstream(dir_.path() + "/token") << token_ << "\n";
  node_ = {{"metadata",
            {{"name", node_name_}, {"labels", json::object()}, {"resourceVersion", "1"}}}};
  server_ = std::make_unique<httplib::SSLServer>((dir_.path() + "/server.crt").c_str(),
                                                 (dir_.path() + "/server.key").c_str());
  // As kube-apiserver's connections are: Go sets TCP_NODELAY on every TCP connection (net:
  // newTCPConn -> setNoDelay), and serves each connection on its own goroutine, however many
  // are open or kept idle between requests (90 s: secure_serving.go's IdleTimeout). cpp-httplib
  // would hold its answer's second write for the client's delayed ACK on a kept connection
  // (Nagle), gives each connection one of 8 threads, kept ones included, and closes a connection
  // after its 5th request. (Its keep-alive timeout stays 5 s: it waits that long at its stop for
  // a client that keeps a connection open.)
  server_->set_tcp_nodelay(true);
  server_->new_task_queue = [] { return new httplib::ThreadPool(32); };
  server_->set_keep_alive_max_count(1000);  // Go's server has no such limit
  // Authentication comes before everything (k8s.io/apiserver/pkg/endpoints/filters/
  // authentication.go). A bearer token that is not ours is 401; with none, the request is the
  // anonymous user's, whom nothing here authorizes: 403. kube-apiserver never takes a bad token
  // for anonymous (pkg/kubeapiserver/authenticator/config.go: union.NewFailOnError).
  server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    absl::Duration delay;
    {
      absl::MutexLock lock(&mu_);
      ++requests_received_;
      delay = answer_delay_;
    }
    absl::SleepFor(delay);
    const std::string authorization = req.get_header_value("Authorization");
    const size_t space = authorization.find(' ');
    std::string scheme = authorization.substr(0, space);
    for (char& c : scheme) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
    const std::string token = space == std::string::npos ? "" : authorization.substr(space + 1);
    if (scheme != "bearer" || token.empty()) {
      Refuse(res, 403, "Forbidden",
             "forbidden: User \"system:anonymous\" cannot " + req.method + " path \"" +
                 req.path + "\"");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (token != token_) {
      Refuse(res, 401, "Unauthorized", "Unauthorized");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  const std::string node_path = "/api/v1/nodes/" + node_name_;
  server_->Get(node_path, [this](const httplib::Request&, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    res.set_content(node_.dump(), "application/json");
  });
  server_->Patch(node_path, [this](const httplib::Request& req, httplib::Response& res) {
    // The Content-Type first: patch.go checks it before it reads anything else.
    if (!IsPatchType(MediaType(req))) return RefuseMediaType(res, kPatchTypes);
    absl::MutexLock lock(&mu_);
    json patched = node_;
    if (!ApplyPatch(req, patched, res)) return;
    if (!ResourceVersionMatches(node_, patched, "nodes", node_name_, res)) return;
    node_ = std::move(patched);
    node_["metadata"]["resourceVersion"] = std::to_string(++revision_);
    res.set_content(node_.dump(), "application/json");
  });
  server_->Put(node_path, [this](const httplib::Request& req, httplib::Response& res) {
    json node;
    if (!ParseObject(req, node, res)) return;
    absl::MutexLock lock(&mu_);
    if (Metadata(node, "name") != node_name_) {
      return Refuse(res, 400, "BadRequest",
                    "the name of the object does not match the name on the URL");
    }
    if (!ResourceVersionMatches(node_, node, "nodes", node_name_, res)) return;
    node_ = std::move(node);
    node_["metadata"]["resourceVersion"] = std::to_string(++revision_);
    res.set_content(node_.dump(), "application/json");
  });
  server_->Post("/api/v1/namespaces/default/events",
                [this](const httplib::Request& req, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    if (refuse_with_ != 0) {
      res.status = refuse_with_;
      res.set_content(R"({"kind":"Status","code":)" + std::to_string(refuse_with_) + "}",
                      "application/json");
      return;
    }
    if (MediaType(req) != "application/json") return RefuseMediaType(res, "application/json");
    json event;
    if (!ParseObject(req, event, res)) return;
    if (Metadata(event, "name").empty() || !event.contains("reason") ||
        !event.contains("involvedObject")) {
      return Refuse(res, 422, "Invalid", "the Event is incomplete");
    }
    const std::string namespace_name = Metadata(event, "namespace");
    if (!namespace_name.empty() && namespace_name != "default") {
      return Refuse(res, 400, "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request");
    }
    event["metadata"]["namespace"] = "default";
    const std::string name = Metadata(event, "name");
    if (events_.contains(name)) {
      return Refuse(res, 409, "AlreadyExists", "events \"" + name + "\" already exists");
    }
    event["metadata"]["resourceVersion"] = std::to_string(++revision_);
    events_[name] = event;
    posts_++;
    res.status = 201;
    res.set_content(event.dump(), "application/json");
  });
  server_->Patch(R"(/api/v1/namespaces/default/events/(.+))",
                 [this](const httplib::Request& req, httplib::Response& res) {
    if (!IsPatchType(MediaType(req))) return RefuseMediaType(res, kPatchTypes);
    absl::MutexLock lock(&mu_);
    const std::string name = req.matches[1];
    if (!events_.contains(name)) {
      return Refuse(res, 404, "NotFound", "events \"" + name + "\" not found");
    }
    json patched = events_[name];
    if (!ApplyPatch(req, patched, res)) return;
    if (!ResourceVersionMatches(events_[name], patched, "events", name, res)) return;
    patched["metadata"]["resourceVersion"] = std::to_string(++revision_);
    events_[name] = std::move(patched);
    patches_++;
    res.set_content(events_[name].dump(), "application/json");
  });
  server_->Put(R"(/api/v1/namespaces/default/events/(.+))",
               [this](const httplib::Request& req, httplib::Response& res) {
    json event;
    if (!ParseObject(req, event, res)) return;
    absl::MutexLock lock(&mu_);
    const std::string name = req.matches[1];
    if (Metadata(event, "name") != name) {
      return Refuse(res, 400, "BadRequest",
                    "the name of the object does not match the name on the URL");
    }
    // Events may be created by an update (their strategy's AllowCreateOnUpdate).
    const bool created = !events_.contains(name);
    if (!created && !ResourceVersionMatches(events_[name], event, "events", name, res)) return;
    event["metadata"]["resourceVersion"] = std::to_string(++revision_);
    events_[name] = std::move(event);
    res.status = created ? 201 : 200;
    res.set_content(events_[name].dump(), "application/json");
  });
  ServeResources();  // resource.k8s.io/v1: test_api_resources.cc
  port_ = server_->bind_to_any_port("127.0.0.1");
  thread_ = ListenInBackground(*server_);
}

TestApiServer::~TestApiServer() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;  // open watches end; their threads are the server's
  }
  server_->stop();
  thread_.join();
}

nlohmann::json TestApiServer::Node() {
  absl::MutexLock lock(&mu_);
  return node_;
}

std::vector<nlohmann::json> TestApiServer::Events() {
  absl::MutexLock lock(&mu_);
  std::vector<nlohmann::json> out;
  for (const auto& [name, event] : events_.items()) out.push_back(event);
  return out;
}

nlohmann::json TestApiServer::WaitForEvent(const std::string& reason, const std::string& text,
                                           int count, absl::Duration timeout) {
  nlohmann::json found;
  auto stored = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [name, event] : events_.items()) {
      if (event.value("reason", "") == reason &&
          event.value("message", "").find(text) != std::string::npos &&
          event.value("count", 0) >= count) {
        found = event;
        return true;
      }
    }
    return false;
  };
  absl::MutexLock lock(&mu_);
  // The handlers change events_ under mu_, which wakes this condition: no polling.
  mu_.AwaitWithTimeout(absl::Condition(&stored), timeout);
  return found;
}

int TestApiServer::event_posts() {
  absl::MutexLock lock(&mu_);
  return posts_;
}

int TestApiServer::event_patches() {
  absl::MutexLock lock(&mu_);
  return patches_;
}

int TestApiServer::requests_received() {
  absl::MutexLock lock(&mu_);
  return requests_received_;
}

void TestApiServer::AnswerSlowly(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  answer_delay_ = delay;
}

void TestApiServer::RefuseEventsWith(int status) {
  absl::MutexLock lock(&mu_);
  refuse_with_ = status;
}

void TestApiServer::ExpireEvents() {
  absl::MutexLock lock(&mu_);
  events_ = nlohmann::json::object();
}

}  // namespace edgeaccel::testing
