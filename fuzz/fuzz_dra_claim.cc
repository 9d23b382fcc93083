// The ResourceClaim reader (NodePrepareResources reads claims from the API server) and the
// prepared-claims checkpoint (read back after a restart): whatever bytes arrive, the readers
// answer or refuse, never crash; what they accept keeps its promises (results only of our
// driver and pool, at most 32; shares that are UIDs; checkpoint spec names that cannot leave the
// CDI directory).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "edgeaccel/dra/claim_reader.h"
#include "edgeaccel/dra/dra_driver.h"
#include "edgeaccel/dra/prepared_claims.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const edgeaccel::ClaimRef claim{"default", "claim", "0d7ab0a2-6c3f-4b8e-9f11-2b7c1c9a0e01"};
  auto allocation = edgeaccel::ReadClaimAllocation(text, claim, "edgetpu.edgeaccel.io", "node-1");
  if (allocation.ok()) {
    if (allocation->results.size() > edgeaccel::kMaxAllocationResults) abort();
    for (const auto& result : allocation->results) {
      if (result.request.find('/') != std::string::npos) abort();
      // A share goes back to the kubelet verbatim: a UID or nothing.
      if (!result.share_id.empty() && !edgeaccel::IsClaimUid(result.share_id)) abort();
    }
  }
  auto claims = edgeaccel::ParsePreparedClaims(text, "edgetpu.edgeaccel.io");
  if (claims.ok()) {
    for (const auto& [uid, prepared] : *claims) {
      if (!edgeaccel::IsClaimUid(uid)) abort();  // keys become paths: claim UIDs only
      if (prepared.cdi_spec.empty() || prepared.cdi_spec.find('/') != std::string::npos ||
          prepared.cdi_spec[0] == '.') {
        abort();
      }
      for (const auto& device : prepared.devices) {
        if (!device.share_id.empty() && !edgeaccel::IsClaimUid(device.share_id)) abort();
      }
    }
    // What it accepted writes back to the same claims.
    auto again = edgeaccel::ParsePreparedClaims(
        edgeaccel::PreparedClaimsJson("edgetpu.edgeaccel.io", *claims), "edgetpu.edgeaccel.io");
    if (!again.ok() || again->size() != claims->size()) abort();
    for (const auto& [uid, prepared] : *claims) {
      const auto it = again->find(uid);
      // A pending record (a prepare under way) stays one, and a prepared one never becomes one.
      if (it == again->end() || it->second.pending != prepared.pending) abort();
    }
  }
  return 0;
}
