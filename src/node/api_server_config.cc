#include "edgeaccel/node/api_server_config.h"

#include <limits.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "edgeaccel/host/host.h"

namespace edgeaccel {
namespace {

// Credentials and kubeconfig files live in this process's own filesystem, not under
// --host-root; Host("/") reads them with the same care (regular files only, bounded size).
std::string ReadLocalFile(const std::string& path) {
  absl::StatusOr<std::string> content = Host("/").ReadFile(path);
  return content.ok() ? *content : std::string();
}

absl::Status RequireNodeName(const std::string& node_name) {
  if (!node_name.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "--label-node needs the node's name: set NODE_NAME (downward API: spec.nodeName) or "
      "--node-name");
}

absl::Status ParseServer(const std::string& server, ApiServerConfig* config) {
  absl::string_view rest = server;
  if (!absl::ConsumePrefix(&rest, "https://")) {
    return absl::InvalidArgumentError(absl::StrCat("the API server must be https://host:port, got ", server));
  }
  rest = absl::StripSuffix(rest, "/");
  const size_t colon = rest.rfind(':');
  config->port = 443;
  if (colon != absl::string_view::npos && rest.back() != ']') {
    const absl::string_view port_text = rest.substr(colon + 1);
    int64_t port = 0;
    if (!absl::SimpleAtoi(port_text, &port)) {
      return absl::InvalidArgumentError(absl::StrCat("the API server has a bad port: ", server));
    }
    // A TCP port: 0 would reach nothing (and -1 or 70000 something else once truncated).
    if (port < 1 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the API server's port must be 1 to 65535, got ", port_text, ": ", server));
    }
    config->port = static_cast<int>(port);
    rest = rest.substr(0, colon);
  }
  config->host = std::string(absl::StripPrefix(absl::StripSuffix(rest, "]"), "["));
  return absl::OkStatus();
}

// The directory that relative paths in the kubeconfig at `path` are relative to, as an absolute
// path: the file's own directory (client-go's ResolveLocalPaths), and `path` itself relative to
// the current directory. Absolute, so the token file, read again for every request, does not
// depend on the working directory later.
std::string KubeconfigDirectory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  if (slash == 0) dir = "/";
  if (dir[0] == '/') return dir;
  char cwd[PATH_MAX];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return dir;  // left relative: the best there is
  return dir == "." ? std::string(cwd) : absl::StrCat(cwd, "/", dir);
}

// A path named in the kubeconfig: absolute as it is, else under the kubeconfig's directory.
std::string BesideKubeconfig(const std::string& path, const std::string& base_dir) {
  if (path.empty() || path[0] == '/') return path;
  return absl::StrCat(base_dir, absl::EndsWith(base_dir, "/") ? "" : "/", path);
}

// A file named in a kubeconfig, or its inline base64 "-data" twin.
absl::StatusOr<std::string> KubeconfigBlob(const YAML::Node& node, const std::string& key,
                                           const std::string& base_dir) {
  if (node[key + "-data"]) {
    std::string decoded;
    if (!absl::Base64Unescape(node[key + "-data"].as<std::string>(), &decoded)) {
      return absl::InvalidArgumentError(absl::StrCat("kubeconfig: ", key, "-data is not base64"));
    }
    return decoded;
  }
  if (node[key]) {
    const std::string path = BesideKubeconfig(node[key].as<std::string>(), base_dir);
    std::string content = ReadLocalFile(path);
    if (content.empty()) return absl::InvalidArgumentError(absl::StrCat("kubeconfig: cannot read ", path));
    return content;
  }
  return std::string();
}

}  // namespace

absl::StatusOr<ApiServerConfig> KubeconfigConfig(const std::string& node_name,
                                                 const std::string& kubeconfig_path) {
  if (absl::Status status = RequireNodeName(node_name); !status.ok()) return status;
  ApiServerConfig config;
  config.node_name = node_name;
  const std::string base_dir = KubeconfigDirectory(kubeconfig_path);
  try {
    YAML::Node doc = YAML::LoadFile(kubeconfig_path);
    const std::string current = doc["current-context"].as<std::string>("");
    auto find = [&](const char* list, const std::string& name) -> YAML::Node {
      for (const YAML::Node& entry : doc[list]) {
        if (entry["name"].as<std::string>("") == name) return entry;
      }
      return YAML::Node();
    };
    YAML::Node context = find("contexts", current)["context"];
    if (!context) {
      return absl::InvalidArgumentError(absl::StrCat("kubeconfig ", kubeconfig_path,
                                                     ": no context named \"", current, "\""));
    }
    YAML::Node cluster = find("clusters", context["cluster"].as<std::string>(""))["cluster"];
    YAML::Node user = find("users", context["user"].as<std::string>(""))["user"];
    if (!cluster) {
      return absl::InvalidArgumentError(absl::StrCat("kubeconfig ", kubeconfig_path,
                                                     ": the current context's cluster is missing"));
    }
    if (absl::Status status = ParseServer(cluster["server"].as<std::string>(""), &config); !status.ok()) {
      return status;
    }
    absl::StatusOr<std::string> ca = KubeconfigBlob(cluster, "certificate-authority", base_dir);
    if (!ca.ok()) return ca.status();
    config.ca_pem = *ca;
    if (user) {
      config.token = user["token"].as<std::string>("");
      if (user["tokenFile"]) {
        config.token_file = BesideKubeconfig(user["tokenFile"].as<std::string>(), base_dir);
      }
      absl::StatusOr<std::string> cert = KubeconfigBlob(user, "client-certificate", base_dir);
      absl::StatusOr<std::string> key = KubeconfigBlob(user, "client-key", base_dir);
      if (!cert.ok()) return cert.status();
      if (!key.ok()) return key.status();
      config.client_cert_pem = *cert;
      config.client_key_pem = *key;
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("kubeconfig ", kubeconfig_path, ": ", e.what()));
  }
  return config;
}


absl::StatusOr<ApiServerConfig> InClusterConfig(const std::string& node_name,
                                                const std::string& api_server,
                                                const std::string& token_file,
                                                const std::string& ca_file) {
  ApiServerConfig config;
  config.node_name = node_name;
  config.token_file = token_file;
  config.ca_file = ca_file;
  if (absl::Status status = RequireNodeName(node_name); !status.ok()) return status;
  std::string server = api_server;
  if (server.empty()) {
    const char* host = getenv("KUBERNETES_SERVICE_HOST");
    const char* port = getenv("KUBERNETES_SERVICE_PORT");
    if (host == nullptr || port == nullptr) {
      return absl::InvalidArgumentError(
          "--label-node outside a pod needs --kubeconfig, or --api-server=https://host:port (with "
          "--api-token-file, --api-ca-file)");
    }
    server = absl::StrCat("https://", host, ":", port);
  }
  if (absl::Status status = ParseServer(server, &config); !status.ok()) return status;
  return config;
}

std::string BearerToken(const ApiServerConfig& config) {
  if (!config.token.empty() || config.token_file.empty()) return config.token;
  return std::string(absl::StripAsciiWhitespace(ReadLocalFile(config.token_file)));
}

}  // namespace edgeaccel
