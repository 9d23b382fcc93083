# Cross-compiles for arm64 on an amd64 Debian with multiarch packages:
#   dpkg --add-architecture arm64
#   apt-get install g++-aarch64-linux-gnu protobuf-compiler protobuf-compiler-grpc \
#                   libgrpc++-dev:arm64 libprotobuf-dev:arm64 ... (Dockerfile.arm64 has the list)
#   cmake -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# protoc and grpc_cpp_plugin run on the build machine; headers are shared (/usr/include) and
# libraries come from /usr/lib/aarch64-linux-gnu.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Programs (protoc, grpc_cpp_plugin) from the build machine; everything else for the target.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
# The configure-time probe of gRPC's internals (cmake/grpc_internals.cmake) runs its program under
# qemu-aarch64 where there is one (Debian's qemu-user). The arm64 loader and libraries come from the
# multiarch packages in /usr/lib/aarch64-linux-gnu, where qemu's ld.so finds them.
find_program(EDGEACCEL_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(EDGEACCEL_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${EDGEACCEL_QEMU_AARCH64}")
endif()
