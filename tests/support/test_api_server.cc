#include "test_api_server.h"

#include <httplib.h>

#include <cstdlib>
#include <fstream>

#include "absl/time/clock.h"

namespace edgeaccel::testing {

bool MakeSelfSignedCertificate(const std::string& dir, const std::string& name,
                               const std::string& subject_alt_name) {
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 "
                          "-addext subjectAltName=" + subject_alt_name + " -keyout " + dir + "/" +
                          name + ".key -out " + dir + "/" + name + ".crt 2>/dev/null";
  return system(cmd.c_str()) == 0;
}

TestApiServer::TestApiServer(std::string node_name) : node_name_(std::move(node_name)) {
  if (!MakeSelfSignedCertificate(dir_.path(), "server")) abort();
  std::ofstream(dir_.path() + "/token") << "secret-token\n";
  node_ = {{"metadata", {{"name", node_name_}, {"labels", nlohmann::json::object()}}}};
  server_ = std::make_unique<httplib::SSLServer>((dir_.path() + "/server.crt").c_str(),
                                                 (dir_.path() + "/server.key").c_str());
  const std::string node_path = "/api/v1/nodes/" + node_name_;
  server_->Get(node_path, [this](const httplib::Request&, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    res.set_content(node_.dump(), "application/json");
  });
  server_->Patch(node_path, [this](const httplib::Request& req, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    node_.merge_patch(nlohmann::json::parse(req.body, nullptr, false));
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
    nlohmann::json event = nlohmann::json::parse(req.body, nullptr, false);
    if (req.get_header_value("Content-Type") != "application/json" || !event.is_object() ||
        !event.contains("metadata") || !event["metadata"].is_object() ||
        event["metadata"].value("namespace", "") != "default" ||
        event["metadata"].value("name", "").empty() || !event.contains("reason") ||
        !event.contains("involvedObject")) {
      res.status = 422;
      return;
    }
    const std::string name = event["metadata"]["name"];
    if (events_.contains(name)) {
      res.status = 409;
      return;
    }
    events_[name] = event;
    posts_++;
    res.status = 201;
    res.set_content(event.dump(), "application/json");
  });
  server_->Patch(R"(/api/v1/namespaces/default/events/(.+))",
                 [this](const httplib::Request& req, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    const std::string name = req.matches[1];
    if (!events_.contains(name)) {
      res.status = 404;
      return;
    }
    if (req.get_header_value("Content-Type") != "application/strategic-merge-patch+json") {
      res.status = 415;
      return;
    }
    events_[name].merge_patch(nlohmann::json::parse(req.body, nullptr, false));
    patches_++;
    res.set_content(events_[name].dump(), "application/json");
  });
  port_ = server_->bind_to_any_port("127.0.0.1");
  thread_ = std::thread([this] { server_->listen_after_bind(); });
}

TestApiServer::~TestApiServer() {
  server_->stop();
  thread_.join();
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

void TestApiServer::RefuseEventsWith(int status) {
  absl::MutexLock lock(&mu_);
  refuse_with_ = status;
}

void TestApiServer::ExpireEvents() {
  absl::MutexLock lock(&mu_);
  events_ = nlohmann::json::object();
}

}  // namespace edgeaccel::testing
