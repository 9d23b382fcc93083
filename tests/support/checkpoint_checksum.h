// The checksum a real kubelet (1.20-1.36) writes into device-plugins/kubelet_internal_checkpoint
// and checks when it reads it back (docs/kubelet-behaviour.md §8): FNV-1a 32 over go-spew's
// "%#v" of checkpoint.checkpointData (DM/checkpoint/checkpoint.go, checksum.New,
// hashutil.DeepHashObject). The kubelet double computes it over exactly the Data it writes.
#ifndef EDGEACCEL_TESTS_SUPPORT_CHECKPOINT_CHECKSUM_H_
#define EDGEACCEL_TESTS_SUPPORT_CHECKPOINT_CHECKSUM_H_

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace edgeaccel::testing {

// go-spew's text of the checkpoint's "Data" object, as the kubelet hashes it.
std::string SpewCheckpointData(const nlohmann::json& data);
// FNV-1a 32 of that text.
uint32_t CheckpointChecksum(const nlohmann::json& data);

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_CHECKPOINT_CHECKSUM_H_
