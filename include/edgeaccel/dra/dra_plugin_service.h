// The kubelet's DRA node services, answered on a CompletionLoop (kubelet/completion_loop.h):
//  * k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin (kubelet 1.34 and later) and
//    k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin (1.32 and 1.33; the same messages, without
//    share_id): NodePrepareResources and NodeUnprepareResources, through ClaimPreparer;
//  * v1alpha1.DRAResourceHealth/NodeWatchResources: the complete health list of the driver's
//    devices, again whenever a device's health changes (kubelet 1.36 opens it for every DRA
//    plugin; answering Unimplemented would make it retry and log every 5 s): a SnapshotStreams
//    method (kubelet/snapshot_stream.h), the machine the device plugin's ListAndWatch runs on.
// Every claim of a request gets an entry in the answer, with its own error: a gRPC error would
// make the kubelet drop the whole answer.
// NodePrepareResources and NodeUnprepareResources are answered off the loop thread: each call
// runs on a thread of its own that lives only while the call is answered (Workers, in parallel),
// and its answer is handed back to the loop to be sent. So a prepare that waits for the API
// server never holds up an unprepare, another prepare or the health stream.
#ifndef EDGEACCEL_DRA_DRA_PLUGIN_SERVICE_H_
#define EDGEACCEL_DRA_DRA_PLUGIN_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>

#include "dra_health_v1alpha1.grpc.pb.h"
#include "dra_v1.grpc.pb.h"
#include "dra_v1beta1.grpc.pb.h"
#include "edgeaccel/dra/claim_preparer.h"
#include "edgeaccel/dra/dra_counters.h"
#include "edgeaccel/host/workers.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/kubelet/completion_loop.h"
#include "edgeaccel/kubelet/snapshot_stream.h"

namespace edgeaccel {

namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;
namespace drahealth = ::v1alpha1;

class DraPluginService {
 public:
  // `preparer` and `set` outlive this object; `pool` is the node's name.
  DraPluginService(ClaimPreparer* preparer, DeviceSet* set, std::string pool, DraCounters* counters);
  ~DraPluginService();

  // The health method's streams (NodeWatchResources).
  using HealthStreams =
      SnapshotStreams<drahealth::NodeWatchResourcesRequest, drahealth::NodeWatchResourcesResponse>;

  // Whose a call is, where several drivers' services share one server and loop (each call goes
  // to the driver whose socket its connection came in on); null: no one's.
  using Route = std::function<DraPluginService*(const grpc::ServerContext& context)>;

  // Starts answering the three services on `loop`: every call this service's, or with `route`,
  // the one it names.
  void Serve(drav1::DRAPlugin::AsyncService* v1, drav1beta1::DRAPlugin::AsyncService* v1beta1,
             drahealth::DRAResourceHealth::AsyncService* health, CompletionLoop* loop,
             Route route = nullptr);
  // Ends the health streams (shutdown); call before the server shuts down.
  void EndStreams() { health_streams_.EndStreams(); }
  // Waits for the calls still being answered off the loop; call once the loop has drained (their
  // answers then go nowhere) and before the server goes.
  void JoinCalls();
  int OpenHealthStreams() const { return health_streams_.OpenStreams(); }

  // The two versions' calls, answered alike, counted in DraCounters (tests call them directly
  // too; the server calls them off the loop).
  template <typename Request, typename Response>
  grpc::Status Prepare(const Request& request, Response* response);
  template <typename Request, typename Response>
  grpc::Status Unprepare(const Request& request, Response* response);

  // The health message for `snapshot` (every device of the driver, Healthy or not).
  drahealth::NodeWatchResourcesResponse HealthMessage(const Snapshot& snapshot) const;

 private:
  ClaimPreparer* const preparer_;
  const std::string pool_;
  DraCounters* const counters_;
  Workers calls_{"ea-dra-call",
                 {.parallel = Workers::kUnbounded, .exit_when_idle = true, .linger = kDraThreadLinger}};
  HealthStreams health_streams_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_DRA_PLUGIN_SERVICE_H_
