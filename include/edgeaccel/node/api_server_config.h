// Where the Kubernetes API server is and how to authenticate to it: in a pod (service account)
// or from a kubeconfig (running outside a pod).
#ifndef EDGEACCEL_NODE_API_SERVER_CONFIG_H_
#define EDGEACCEL_NODE_API_SERVER_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace edgeaccel {

struct ApiServerConfig {
  std::string host;        // API server host or IP
  int port = 443;
  std::string ca_file;     // CA bundle that signed the API server's certificate...
  std::string ca_pem;      // ...or the bundle itself (kubeconfig certificate-authority-data)
  std::string token_file;  // bearer token, re-read for every request (tokens are rotated)...
  std::string token;       // ...or the token itself (kubeconfig)
  std::string client_cert_pem;  // client certificate authentication (kubeconfig)
  std::string client_key_pem;
  std::string node_name;
  absl::Duration timeout = absl::Seconds(10);
  absl::Duration initial_backoff = absl::Seconds(1);
  absl::Duration max_backoff = absl::Minutes(5);
};

// In a pod: KUBERNETES_SERVICE_HOST/PORT and the service account's token and CA. `api_server`
// ("https://host:port"), when given, replaces the first.
absl::StatusOr<ApiServerConfig> InClusterConfig(const std::string& node_name,
                                                const std::string& api_server,
                                                const std::string& token_file,
                                                const std::string& ca_file);

// From a kubeconfig (the file kubectl uses), for running outside a pod: the current context's
// cluster (server, certificate-authority or -data) and user (token, tokenFile, or
// client-certificate/-key or their -data). Relative paths are relative to the file's directory.
absl::StatusOr<ApiServerConfig> KubeconfigConfig(const std::string& node_name,
                                                 const std::string& kubeconfig_path);

// The bearer token to send now: the inline one, or token_file read afresh (service account
// tokens are rotated). Empty when there is none.
std::string BearerToken(const ApiServerConfig& config);

}  // namespace edgeaccel

#endif  // EDGEACCEL_NODE_API_SERVER_CONFIG_H_
