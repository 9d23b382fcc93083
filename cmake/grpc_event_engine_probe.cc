// Configure-time check for kubelet/grpc_event_engine (cmake/grpc_internals.cmake): the module
// compiles and links against the installed gRPC's EventEngine interface, which is experimental
// and changed after gRPC 1.51 (GetDNSResolver's return type, for one).
#include "edgeaccel/kubelet/grpc_event_engine.h"

int main() { return edgeaccel::MakeOneThreadEventEngine("ea-probe") != nullptr ? 0 : 1; }
