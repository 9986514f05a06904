# cmake -DDEST=DIR -DEXES="a;b" -DLIBS="c" -P bundle_libs.cmake
#
# Build tree only (see python/CMakeLists.txt): copies the shared libraries that EXES and LIBS
# need, transitively, into DEST under their sonames, except the C/C++ runtime (which the torch
# chroots have, newer). With a DT_RPATH of $ORIGIN/../lib, the same binaries then run inside
# the Debian trixie/sid chroots, which lack bookworm's libfmt9, libsodium23, gRPC and others.
file(GET_RUNTIME_DEPENDENCIES
  EXECUTABLES ${EXES}
  LIBRARIES ${LIBS}
  RESOLVED_DEPENDENCIES_VAR deps
  UNRESOLVED_DEPENDENCIES_VAR missing
  CONFLICTING_DEPENDENCIES_PREFIX conflict
  PRE_EXCLUDE_REGEXES
    "^(libc|libm|libdl|librt|libpthread|libutil|libresolv|libstdc\\+\\+|libgcc_s|ld-linux[^/]*|linux-vdso)\\.so.*"
    "^libtcpstore\\.so.*")
if(missing)
  message(FATAL_ERROR "bundle_libs: unresolved: ${missing}")
endif()
# After a first run the run path also finds the copies in DEST: take the system's file.
foreach(name IN LISTS conflict_FILENAMES)
  foreach(path IN LISTS conflict_${name})
    if(NOT path MATCHES "/\\.\\./lib/" AND NOT path MATCHES "^${DEST}/")
      list(APPEND deps "${path}")
      break()
    endif()
  endforeach()
endforeach()
foreach(dep IN LISTS deps)
  get_filename_component(name "${dep}" NAME)
  get_filename_component(dir "${dep}" REALPATH)
  get_filename_component(dest_real "${DEST}/${name}" REALPATH)
  if(NOT dir STREQUAL dest_real)
    configure_file("${dep}" "${DEST}/${name}" COPYONLY)
  endif()
endforeach()
