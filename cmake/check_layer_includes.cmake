# Fails the build when a file of one layer includes what its layer may not use.
#
# Run by edgeaccel_layer() (CMakeLists.txt) before a layer library compiles, as
#   cmake -DLAYER=<name> -DALLOWED_LAYERS=<a,b> -DFORBIDDEN=<regex,...> -DFILES=<f,...>
#         -DSTAMP=<file> -P check_layer_includes.cmake
# (comma-separated lists: a ";" would not survive the build tool's command line).
# Our own headers are edgeaccel/<layer>/<module>.h: a file may include those of ALLOWED_LAYERS
# only. FORBIDDEN holds regular expressions for third-party headers the layer must not see
# (gRPC and protobuf outside kubelet/, for example). The check reads the sources as text, so it
# catches an include even where the compiler would find the header on the system path.
cmake_minimum_required(VERSION 3.18)

string(REPLACE "," ";" ALLOWED_LAYERS "${ALLOWED_LAYERS}")
string(REPLACE "," ";" FORBIDDEN "${FORBIDDEN}")
string(REPLACE "," ";" FILES "${FILES}")
string(REPLACE ";" "," allowed "${ALLOWED_LAYERS}")
set(problems "")
foreach(file IN LISTS FILES)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"].*$" "\\1" header "${line}")
    if(header MATCHES "^edgeaccel/")
      if(header MATCHES "^edgeaccel/([a-z_]+)/[^/]+$")
        set(layer_of_header "${CMAKE_MATCH_1}")
        if(NOT layer_of_header IN_LIST ALLOWED_LAYERS)
          string(APPEND problems "\n  ${file}: #include \"${header}\": the ${LAYER} layer may use "
                 "only edgeaccel/{${allowed}}/")
        endif()
      else()
        string(APPEND problems "\n  ${file}: #include \"${header}\": our headers are "
               "edgeaccel/<layer>/<module>.h")
      endif()
      continue()
    endif()
    foreach(pattern IN LISTS FORBIDDEN)
      if(header MATCHES "${pattern}")
        string(APPEND problems "\n  ${file}: #include <${header}>: the ${LAYER} layer must not "
               "use this library (see docs/architecture.md, Layers)")
      endif()
    endforeach()
  endforeach()
endforeach()

if(problems)
  message(FATAL_ERROR "layer ${LAYER}: includes outside what the layer may use:${problems}")
endif()
file(WRITE "${STAMP}" "")
