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
//
// It also serves resource.k8s.io/v1 (test_api_resources.cc) as kube-apiserver 1.34-1.36 does for
// what a DRA driver sends, with the same authentication:
//  * ResourceClaims: GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>, the
//    claims the test added (AddResourceClaim), else 404 NotFound;
//  * ResourceSlices (cluster-scoped) at /apis/resource.k8s.io/v1/resourceslices: LIST with a
//    fieldSelector on spec.driver, spec.nodeName, metadata.name (another field is 400), GET,
//    POST (application/json; metadata.name or generateName + 5 random characters), PUT (an
//    update naming another resourceVersion is 409 Conflict, none is unconditional as
//    resourceslices allow), DELETE with DeleteOptions preconditions (uid, resourceVersion: 409
//    on a mismatch) and DELETE of the collection by fieldSelector (what the kubelet does);
//  * a slice is decoded as the server decodes it (a value of the wrong JSON type or a bad
//    quantity is 400; unknown fields are dropped, with a Warning header, or 400 with
//    ?fieldValidation=Strict; quantities come back canonical, 1024Mi as 1Gi) and validated as
//    ValidateResourceSlice(Update) does: 422 Invalid, details.causes naming each field;
//  * the server sets metadata.uid, creationTimestamp, resourceVersion (the revision the Node
//    and Events share) and generation (1, +1 on a change of spec); an update that changes
//    nothing writes nothing (the resourceVersion stays);
//  * device taints (KEP-5055; DRADeviceTaints, beta and on by default in 1.36: pkg/features/
//    kube_features.go): validated as validateDeviceTaint does (key a label name, value a label
//    value, effect NoSchedule, NoExecute or None), timeAdded set where a taint has none ("added
//    automatically during create or update if not set", k8s.io/api resource/v1 types.go); with
//    the gate off (DisableDeviceTaints) they are dropped without an error unless the stored slice
//    already has some (strategy.go dropDisabledDRADeviceTaintsFields, pkg/registry/resource/
//    resourceslice);
//  * the garbage collector: a slice whose owners are all Nodes that do not exist (another name,
//    or another uid than node_uid()) is deleted as soon as it is written;
//  * WATCH of the collection (?watch=true, with the LIST's fieldSelector), as the apiserver's
//    watch cache serves it (staging/src/k8s.io/apiserver/pkg/storage/cacher): a 200 answer,
//    chunked, one JSON event per line ({"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR,
//    "object": ...}); from resourceVersion R every change after R (R empty or "0": ADDED for each
//    slice stored now first); R older than the history kept (CompactSliceHistory) is one ERROR
//    event with a 410 Expired Status ("too old resource version: R (oldest)"), then the end; a
//    DELETED event's object carries the deletion's resourceVersion; BOOKMARK events (only with
//    allowWatchBookmarks=true) carry just metadata.resourceVersion; the server ends the stream
//    after timeoutSeconds (default: 30 to 60 minutes, as --min-request-timeout 1800 s picks);
//    an event is sent when the object, as written, matches the selector.
// Not served: PATCH, labelSelector and dryRun on slices, a watch of one slice (501, said so),
// other resources and versions (404 NotFound with a Status, as the real one answers a path it
// does not serve).
#ifndef EDGEACCEL_TESTS_SUPPORT_TEST_API_SERVER_H_
#define EDGEACCEL_TESTS_SUPPORT_TEST_API_SERVER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "edgeaccel/node/api_client.h"
#include "edgeaccel/node/api_server_config.h"
#include "fixture_host.h"

namespace httplib {
class Server;
class SSLServer;
struct Request;
struct Response;
}

namespace edgeaccel::testing {

// Writes DIR/NAME.crt and DIR/NAME.key: a self-signed certificate for CN 127.0.0.1 with
// `subject_alt_name`, made with the openssl command. False if openssl failed.
bool MakeSelfSignedCertificate(const std::string& dir, const std::string& name,
                               const std::string& subject_alt_name = "IP:127.0.0.1");

// A client's config for node-1's API server at 127.0.0.1:`port` (a SilentTcpServer's, say): a CA
// made in `dir` (ca.crt; a server that never answers needs no certificate of its own) and
// `timeout`. Its host is empty where openssl failed.
ApiServerConfig ApiServerConfigFor(int port, const std::string& dir, absl::Duration timeout);

// Runs the accept loop of `server` (bound already) on a new thread, and returns that thread once
// the loop runs. Before that, httplib's stop() does nothing, and a server stopped that early
// (a test that never sent it a request) would never end its thread.
std::thread ListenInBackground(httplib::Server& server);

// Opens a watch and reads it to its end on the caller's thread (what the daemon's loop does as
// the answer arrives): each event line to `on_event`. The answer (200 with no body, or any other
// status whole), `on_event`'s own error, the connection's, or DEADLINE_EXCEEDED at `deadline`.
absl::StatusOr<HttpResponse> ReadWatch(const ApiClient& client, absl::string_view path,
                                       absl::Time deadline,
                                       const std::function<absl::Status(absl::string_view)>& on_event);

class TestApiServer {
 public:
  // Serves node `node_name` on 127.0.0.1 with a fresh self-signed certificate.
  explicit TestApiServer(std::string node_name = "node-1");
  ~TestApiServer();

  int port() const { return port_; }
  std::string url() const { return "https://127.0.0.1:" + std::to_string(port_); }
  std::string ca_file() const { return dir_.path() + "/server.crt"; }
  std::string token_file() const { return dir_.path() + "/token"; }
  // What the daemon's API client is given to talk to this server as node `node_name`'s daemon.
  ApiServerConfig ClientConfig(absl::Duration timeout = absl::Seconds(5)) const {
    ApiServerConfig config;
    config.host = "127.0.0.1";
    config.port = port_;
    config.ca_file = ca_file();
    config.token_file = token_file();
    config.node_name = node_name_;
    config.timeout = timeout;
    return config;
  }

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

  // Every request from now on is answered only after `delay`, as by an overloaded API server
  // (0: at once).
  void AnswerSlowly(absl::Duration delay);
  // Requests received so far (counted on arrival, before any delay).
  int requests_received();

  // The Node's metadata.uid (a slice's ownerReference to the Node must carry it).
  const std::string& node_uid() const { return node_uid_; }
  // The Node as stored now (its labels as the daemon's patches left them).
  nlohmann::json Node();

  // resource.k8s.io/v1 ResourceClaims (test_api_resources.cc).
  // A claim in namespace `ns` named `name`, allocated: one request per distinct request name of
  // `results` ({request, device} pairs), each result {request, driver, pool, device}, the
  // allocation's nodeSelector the node named `pool` (as for a node-local pool), reserved for
  // one pod. Not stored: pass it to AddResourceClaim (after changing what a test needs).
  static nlohmann::json MakeAllocatedClaim(
      const std::string& ns, const std::string& name, const std::string& driver,
      const std::string& pool, const std::vector<std::pair<std::string, std::string>>& results);
  // Stores `claim` (metadata.namespace and name required) as the API server holds it: kind,
  // apiVersion, metadata.uid (when missing), creationTimestamp and a new resourceVersion
  // filled in. Replaces a claim of the same name. Returns the stored object.
  nlohmann::json AddResourceClaim(const nlohmann::json& claim);
  // False when there was no such claim.
  bool DeleteResourceClaim(const std::string& ns, const std::string& name);
  // The claim deleted and created again under the same name: a new uid (the "got replaced"
  // case a driver must notice). The first keeps what the stored one holds, the second stores
  // `claim` (a uid it carries that is the old one's is replaced). Null when there is none.
  nlohmann::json ReplaceResourceClaim(const std::string& ns, const std::string& name);
  nlohmann::json ReplaceResourceClaim(const nlohmann::json& claim);
  // The stored claim, or null.
  nlohmann::json ResourceClaim(const std::string& ns, const std::string& name);
  // GETs of claims answered (any status).
  int resource_claim_gets();
  // The next `n` GETs of claims answer `status` (with its Status reason).
  void FailNextClaimGets(int status, int n);

  // resource.k8s.io/v1 ResourceSlices (test_api_resources.cc).
  // Every stored slice, by name.
  std::vector<nlohmann::json> ResourceSlices();
  // Waits (up to `timeout`) until `predicate` holds for the stored slices (by name); true if it
  // did, with those slices in `*slices` when given. The handlers wake it: no polling.
  // `predicate` runs under the server's lock: it must not call this server.
  bool WaitForResourceSlices(
      const std::function<bool(const std::vector<nlohmann::json>&)>& predicate,
      absl::Duration timeout = absl::Seconds(10), std::vector<nlohmann::json>* slices = nullptr);
  // Stores `slice` as another writer would have created it (no validation; metadata.name or
  // generateName; server fields set). Returns the stored object.
  nlohmann::json AddResourceSlice(const nlohmann::json& slice);
  // Deletes the slices of `node_name` (and of `driver` when given), as the kubelet does at its
  // start (and when a driver's plugin goes): how many it deleted.
  int DeleteAllResourceSlices(const std::string& node_name, const std::string& driver = "");
  // Client requests that changed slices and were answered 2xx: POST, PUT (one that changed
  // nothing too), DELETE, DELETE of the collection (one each).
  int resource_slice_writes();
  // Slices the garbage collector deleted (their owner Node does not exist).
  int resource_slices_collected();
  // The next `n` PUTs of an existing slice answer 409 Conflict as if another writer had updated
  // it just before: its resourceVersion moves on (content unchanged), so a retry must GET it.
  void ConflictNextSliceUpdates(int n);
  // The next `n` requests under /resourceslices (any method) answer `status`.
  void FailNextSliceRequests(int status, int n);
  // As kube-apiserver with --feature-gates=DRADeviceTaints=false: taints are dropped on write.
  void DisableDeviceTaints();
  // The gate turned on again (an API server restarted with it).
  void EnableDeviceTaints();
  // LISTs and WATCHes of the slices collection received (answered with any status).
  int resource_slice_lists();
  int resource_slice_watches();
  // Watches whose stream is open now.
  int open_slice_watches();
  // Forgets the history of slice changes up to now, as etcd's compaction and the watch cache's
  // window do: a watch from an older resourceVersion is answered 410 Expired.
  void CompactSliceHistory();
  // Ends every open watch now, as the server does at its timeoutSeconds.
  void EndSliceWatches();
  // Sends a BOOKMARK at the current resourceVersion on every open watch that asked for them.
  void BookmarkSliceWatches();
  // Ends every later watch at once, a 200 with no event (a proxy that cuts long requests, an API
  // server going down), while `at_once`.
  void EndSliceWatchesAtOnce(bool at_once);
  // Answers every later watch with `status` (403: a role without the watch verb; 0: serve).
  void RefuseSliceWatches(int status);

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
  absl::Duration answer_delay_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  int requests_received_ ABSL_GUARDED_BY(mu_) = 0;

  // test_api_resources.cc: the resource.k8s.io/v1 routes, registered by the constructor before
  // it binds, and what they keep.
  void ServeResources();
  void ServeResourceClaims();
  void ServeResourceSlices();
  // Answers an injected failure for a request under /resourceslices; false when none is due.
  bool InjectedSliceFailure(httplib::Response& res) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores `slice` under its name with a new resourceVersion, then lets the garbage collector
  // look at it. The stored object.
  nlohmann::json StoreSlice(nlohmann::json slice) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // metadata.name from generateName: a name no stored slice has.
  std::string GenerateSliceName(const std::string& base) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string node_uid_;
  std::map<std::string, nlohmann::json> claims_ ABSL_GUARDED_BY(mu_);  // by "<ns>/<name>"
  std::map<std::string, nlohmann::json> slices_ ABSL_GUARDED_BY(mu_);  // by name
  int claim_gets_ ABSL_GUARDED_BY(mu_) = 0;
  int claim_fail_status_ ABSL_GUARDED_BY(mu_) = 0;
  int claim_fail_left_ ABSL_GUARDED_BY(mu_) = 0;
  int slice_writes_ ABSL_GUARDED_BY(mu_) = 0;
  int slices_collected_ ABSL_GUARDED_BY(mu_) = 0;
  int slice_conflicts_left_ ABSL_GUARDED_BY(mu_) = 0;
  int slice_fail_status_ ABSL_GUARDED_BY(mu_) = 0;
  int slice_fail_left_ ABSL_GUARDED_BY(mu_) = 0;
  bool device_taints_ ABSL_GUARDED_BY(mu_) = true;
  // The history of slice changes, for watches (oldest first).
  struct SliceEvent {
    uint64_t revision;
    std::string type;  // ADDED, MODIFIED, DELETED
    nlohmann::json object;
  };
  std::vector<SliceEvent> slice_events_ ABSL_GUARDED_BY(mu_);
  uint64_t slice_history_start_ ABSL_GUARDED_BY(mu_) = 0;  // the oldest revision a watch can start at
  int slice_lists_ ABSL_GUARDED_BY(mu_) = 0;
  int slice_watches_ ABSL_GUARDED_BY(mu_) = 0;
  int open_slice_watches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t watch_ends_ ABSL_GUARDED_BY(mu_) = 0;       // EndSliceWatches() calls
  uint64_t watch_bookmarks_ ABSL_GUARDED_BY(mu_) = 0;  // BookmarkSliceWatches() calls
  int watch_refusal_ ABSL_GUARDED_BY(mu_) = 0;
  bool end_watches_at_once_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // the destructor runs: watches end
  // Records a change of the slice `object` (as stored, or as it was when deleted) at revision_.
  void SliceChanged(const std::string& type, nlohmann::json object)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Serves GET ...resourceslices?watch=true.
  void WatchSlices(const httplib::Request& req, httplib::Response& res)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PrepareForCreate/PrepareForUpdate for taints (`old_spec` null on create).
  void PrepareTaints(nlohmann::json& spec, const nlohmann::json* old_spec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_TEST_API_SERVER_H_
