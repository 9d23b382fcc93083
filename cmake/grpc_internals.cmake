# Which of gRPC's internals kubelet/grpc_event_engine and kubelet/grpc_timers may use, decided by
# proof at configure time, not by version numbers (docs/footprint.md, "gRPC's threads"):
#
# EDGEACCEL_GRPC_EVENT_ENGINE: our one-thread EventEngine compiles against the installed gRPC's
#   EventEngine interface (experimental; its methods changed after 1.51). Otherwise gRPC keeps
#   its own engine (a pool of clamp(cores, 2, 32) threads and a timer thread).
# EDGEACCEL_GRPC_TIMERS: the timer replacement, built from its own source against the installed
#   gRPC, links (the internal symbols exist, ExecCtx::Run with this absl's inline namespace in its
#   name) and passes cmake/grpc_timers_probe.cc when run: a call's deadline fires through it at its
#   time, a cancelled call's timer leaves it, gRPC's timer threads never start. That is what
#   proves the struct layouts it assumes. Otherwise gRPC keeps its own timer threads.
#
# Cross-compiling, the probe runs under CMAKE_CROSSCOMPILING_EMULATOR (the aarch64 toolchain file
# sets qemu-aarch64 when there is one); without an emulator the replacement stays off.
# -DEDGEACCEL_GRPC_INTERNALS=OFF turns both off without probing.
#
# Always, whatever EDGEACCEL_GRPC_INTERNALS says: cmake/grpc_peer_probe.cc proves that a call on a
# connection handed to the server with grpc::AddInsecureChannelFromFd(server, fd) reports its peer
# as "fd:<fd>", the name dra/dra_grpc_server.cc parses to tell which driver's socket a call came in
# on. The format is gRPC's own, not an API, so configuring fails where the probe does not build or
# does not pass; cross-compiling with no emulator, it is skipped.
option(EDGEACCEL_GRPC_INTERNALS "Probe gRPC's internals and use them where the probe passes" ON)

# absl's inline namespace as the Itanium ABI spells it in a symbol name: "<length><name>", or
# nothing when absl has none.
set(EDGEACCEL_ABSL_MANGLED_NAMESPACE "")
get_target_property(_absl_includes absl::base INTERFACE_INCLUDE_DIRECTORIES)
find_file(_absl_options absl/base/options.h PATHS ${_absl_includes} NO_DEFAULT_PATH)
if(_absl_options)
  file(STRINGS "${_absl_options}" _absl_use REGEX "^#define ABSL_OPTION_USE_INLINE_NAMESPACE ")
  file(STRINGS "${_absl_options}" _absl_name REGEX "^#define ABSL_OPTION_INLINE_NAMESPACE_NAME ")
  if(_absl_use MATCHES " 1$" AND _absl_name MATCHES "NAME ([A-Za-z0-9_]+)$")
    string(LENGTH "${CMAKE_MATCH_1}" _length)
    set(EDGEACCEL_ABSL_MANGLED_NAMESPACE "${_length}${CMAKE_MATCH_1}")
  endif()
endif()
unset(_absl_options CACHE)

set(EDGEACCEL_GRPC_EVENT_ENGINE 0)
set(EDGEACCEL_GRPC_TIMERS 0)
set(EDGEACCEL_GRPC_TIMERS_WHY "turned off (-DEDGEACCEL_GRPC_INTERNALS=OFF)")
if(EDGEACCEL_GRPC_INTERNALS)
  set(_probe_dir "${CMAKE_BINARY_DIR}/grpc-internals-probe")
  set(_probe_flags "-DINCLUDE_DIRECTORIES=${CMAKE_SOURCE_DIR}/include")
  try_compile(_engine_compiles "${_probe_dir}/engine"
    SOURCES "${CMAKE_SOURCE_DIR}/cmake/grpc_event_engine_probe.cc"
            "${CMAKE_SOURCE_DIR}/src/kubelet/grpc_event_engine.cc"
    CMAKE_FLAGS "${_probe_flags}"
    COMPILE_DEFINITIONS -DEDGEACCEL_GRPC_EVENT_ENGINE=1
    LINK_LIBRARIES gRPC::grpc++_unsecure Threads::Threads
    CXX_STANDARD 17
    OUTPUT_VARIABLE _engine_output)
  if(_engine_compiles)
    set(EDGEACCEL_GRPC_EVENT_ENGINE 1)
  else()
    file(WRITE "${_probe_dir}/engine-compile.log" "${_engine_output}")
  endif()
  if(NOT EDGEACCEL_GRPC_EVENT_ENGINE)
    set(EDGEACCEL_GRPC_TIMERS_WHY "our EventEngine does not compile against gRPC ${gRPC_VERSION}")
  elseif(CMAKE_CROSSCOMPILING AND NOT CMAKE_CROSSCOMPILING_EMULATOR)
    set(EDGEACCEL_GRPC_TIMERS_WHY "cross-compiling with no emulator to run the probe")
  else()
    try_run(_probe_ran _probe_compiled "${_probe_dir}/timers"
      SOURCES "${CMAKE_SOURCE_DIR}/cmake/grpc_timers_probe.cc"
              "${CMAKE_SOURCE_DIR}/src/kubelet/grpc_timers.cc"
              "${CMAKE_SOURCE_DIR}/src/kubelet/grpc_event_engine.cc"
      CMAKE_FLAGS "${_probe_flags}"
      COMPILE_DEFINITIONS -DEDGEACCEL_GRPC_EVENT_ENGINE=1 -DEDGEACCEL_GRPC_TIMERS=1
                          -DEDGEACCEL_ABSL_MANGLED_NAMESPACE=${EDGEACCEL_ABSL_MANGLED_NAMESPACE}
      LINK_LIBRARIES gRPC::grpc++_unsecure Threads::Threads
      CXX_STANDARD 17
      COMPILE_OUTPUT_VARIABLE _probe_compile_output
      RUN_OUTPUT_VARIABLE _probe_run_output)
    if(NOT _probe_compiled)
      set(EDGEACCEL_GRPC_TIMERS_WHY "the probe does not build against gRPC ${gRPC_VERSION} (symbols missing?)")
      file(WRITE "${_probe_dir}/timers-compile.log" "${_probe_compile_output}")
    elseif(NOT _probe_ran EQUAL 0)
      string(STRIP "${_probe_run_output}" _probe_run_output)
      set(EDGEACCEL_GRPC_TIMERS_WHY "the probe failed (${_probe_ran}): ${_probe_run_output}")
    else()
      set(EDGEACCEL_GRPC_TIMERS 1)
      set(EDGEACCEL_GRPC_TIMERS_WHY "the probe passed")
    endif()
  endif()
endif()
message(STATUS "gRPC ${gRPC_VERSION} internals: our EventEngine "
               "${EDGEACCEL_GRPC_EVENT_ENGINE}, timers on it ${EDGEACCEL_GRPC_TIMERS} "
               "(${EDGEACCEL_GRPC_TIMERS_WHY})")

# How this gRPC names a connection added from a descriptor: DRA calls are routed by it.
set(_peer_probe_dir "${CMAKE_BINARY_DIR}/grpc-internals-probe/peer")
if(CMAKE_CROSSCOMPILING AND NOT CMAKE_CROSSCOMPILING_EMULATOR)
  message(STATUS "gRPC ${gRPC_VERSION} peer names: not probed (cross-compiling with no emulator "
                 "to run cmake/grpc_peer_probe.cc); dra/dra_grpc_server.cc assumes \"fd:<N>\"")
else()
  try_run(_peer_probe_ran _peer_probe_compiled "${_peer_probe_dir}"
    SOURCES "${CMAKE_SOURCE_DIR}/cmake/grpc_peer_probe.cc"
    LINK_LIBRARIES gRPC::grpc++_unsecure Threads::Threads
    CXX_STANDARD 17
    COMPILE_OUTPUT_VARIABLE _peer_probe_compile_output
    RUN_OUTPUT_VARIABLE _peer_probe_run_output)
  if(NOT _peer_probe_compiled)
    message(FATAL_ERROR "cmake/grpc_peer_probe.cc does not build against gRPC ${gRPC_VERSION}, so "
                        "nothing proves how it names a connection added from a descriptor, which "
                        "dra/dra_grpc_server.cc uses to tell which driver's socket a call came in "
                        "on:\n${_peer_probe_compile_output}")
  elseif(NOT _peer_probe_ran EQUAL 0)
    string(STRIP "${_peer_probe_run_output}" _peer_probe_run_output)
    message(FATAL_ERROR "gRPC ${gRPC_VERSION} does not name a connection added from a descriptor "
                        "\"fd:<N>\", which dra/dra_grpc_server.cc uses to tell which driver's "
                        "socket a call came in on. cmake/grpc_peer_probe.cc failed "
                        "(${_peer_probe_ran}): ${_peer_probe_run_output}")
  endif()
  message(STATUS "gRPC ${gRPC_VERSION} peer names: a connection added from descriptor N is "
                 "\"fd:N\" (cmake/grpc_peer_probe.cc passed)")
endif()
