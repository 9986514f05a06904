# Installation: programs, public headers, static and shared libraries, an exported CMake
# package (find_package(tcpstore) -> tcpstore::client, tcpstore::server, tcpstore::shared),
# pkg-config files, man pages and (for a /usr install, i.e. the .deb) the systemd unit.
#
# Components: runtime (programs, libtcpstore.so.N), devel (headers, static libraries,
# libtcpstore.so link, CMake and pkg-config files), man, service (systemd unit and its
# /etc/default file). A plain `cmake --install` installs all of them.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TCPSTORE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/tcpstore)
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(_tcpstore_service_default ON)
else()
  set(_tcpstore_service_default OFF)
endif()
option(TCPSTORE_INSTALL_SERVICE
       "Install the systemd unit and /etc/default/tcpstore-server (default: ON for prefix /usr)"
       ${_tcpstore_service_default})

# The libraries an installed library needs at link time: static libraries carry their
# dependencies, so every tcpstore_* library they link (PUBLIC or PRIVATE) must be installed
# and exported too. Found by walking LINK_LIBRARIES, so a library added later is installed
# with its users without touching this file.
function(tcpstore_link_closure out)
  set(seen)
  set(todo ${ARGN})
  while(todo)
    list(POP_FRONT todo t)
    get_target_property(real ${t} ALIASED_TARGET)
    if(real)
      set(t ${real})
    endif()
    if(t IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${t})
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(libs ${t} INTERFACE_LINK_LIBRARIES)
    else()
      get_target_property(libs ${t} LINK_LIBRARIES)
    endif()
    foreach(l IN LISTS libs)
      if(l MATCHES "^\\$<|^::@" OR NOT TARGET "${l}")
        continue()
      endif()
      get_target_property(imported ${l} IMPORTED)
      if(NOT imported)
        list(APPEND todo ${l})
      endif()
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

set(_tcpstore_public_libs tcpstore_client tcpstore_server tcpstore_shared)
tcpstore_link_closure(_tcpstore_export_libs ${_tcpstore_public_libs})
foreach(t IN LISTS _tcpstore_export_libs)
  string(REGEX REPLACE "^tcpstore_" "" _name ${t})
  set_target_properties(${t} PROPERTIES EXPORT_NAME ${_name})
endforeach()
# Consumers see include/ only (the repo root stays a build-tree include of the internals).
foreach(t IN LISTS _tcpstore_public_libs)
  target_include_directories(${t} INTERFACE
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
endforeach()
target_include_directories(tcpstore_protocol INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

install(TARGETS tcpstore-server tcpstore-cli
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(TARGETS ${_tcpstore_export_libs} EXPORT tcpstore-targets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT devel
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
# The public headers and nothing else (protocol/, store/ headers are internal).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tcpstore
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT devel
  FILES_MATCHING PATTERN "*.h")

install(EXPORT tcpstore-targets NAMESPACE tcpstore:: FILE tcpstoreTargets.cmake
  DESTINATION ${TCPSTORE_CMAKE_DIR} COMPONENT devel)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/tcpstoreConfig.cmake.in
  ${PROJECT_BINARY_DIR}/tcpstoreConfig.cmake INSTALL_DESTINATION ${TCPSTORE_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tcpstoreConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tcpstoreConfig.cmake
              ${PROJECT_BINARY_DIR}/tcpstoreConfigVersion.cmake
  DESTINATION ${TCPSTORE_CMAKE_DIR} COMPONENT devel)

# pkg-config: tcpstore.pc is the client (C++ and C API) in libtcpstore.so; tcpstore-server.pc
# the embeddable server (static libraries). Paths are relative to the .pc file, so an
# installed tree can be moved (and a DESTDIR/--prefix install in tests works).
# tcpstore-server.pc lists the server's static libraries in link order (users first): a
# depth-first post-order of LINK_LIBRARIES, reversed.
function(_tcpstore_topo_visit t)
  get_property(done GLOBAL PROPERTY _tcpstore_topo_done)
  if(t IN_LIST done)
    return()
  endif()
  set_property(GLOBAL APPEND PROPERTY _tcpstore_topo_done ${t})
  get_target_property(libs ${t} LINK_LIBRARIES)
  foreach(l IN LISTS libs)
    if(NOT l MATCHES "^\\$<|^::@" AND TARGET "${l}")
      get_target_property(real ${l} ALIASED_TARGET)
      if(real)
        set(l ${real})
      endif()
      get_target_property(type ${l} TYPE)
      get_target_property(imported ${l} IMPORTED)
      if(type STREQUAL "STATIC_LIBRARY" AND NOT imported)
        _tcpstore_topo_visit(${l})
      endif()
    endif()
  endforeach()
  set_property(GLOBAL APPEND PROPERTY _tcpstore_topo_order "-l$<TARGET_FILE_BASE_NAME:${t}>")
endfunction()
_tcpstore_topo_visit(tcpstore_server)
get_property(_tcpstore_server_libs GLOBAL PROPERTY _tcpstore_topo_order)
list(REVERSE _tcpstore_server_libs)
list(JOIN _tcpstore_server_libs " " TCPSTORE_SERVER_PC_LIBS)

file(RELATIVE_PATH _tcpstore_pc_up
  /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" _tcpstore_pc_up "${_tcpstore_pc_up}")
set(TCPSTORE_PC_PREFIX "\${pcfiledir}/${_tcpstore_pc_up}")
foreach(pc tcpstore tcpstore-server)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/${pc}.pc.in ${PROJECT_BINARY_DIR}/${pc}.pc.gen @ONLY)
  file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/${pc}.pc INPUT ${PROJECT_BINARY_DIR}/${pc}.pc.gen)
  install(FILES ${PROJECT_BINARY_DIR}/${pc}.pc
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT devel)
endforeach()

# Man pages from the programs' --help (help2man) plus packaging/<program>.h2m (sections the
# --help text lacks), gzip'ed as Debian ships them.
find_program(TCPSTORE_HELP2MAN help2man)
if(TCPSTORE_HELP2MAN)
  set(_tcpstore_man_name_tcpstore-server "c10d TCPStore server for PyTorch 1.13 and 2.x")
  set(_tcpstore_man_name_tcpstore-cli "command-line client of a c10d TCPStore server")
  set(_tcpstore_man_pages)
  foreach(prog tcpstore-server tcpstore-cli)
    set(_page ${PROJECT_BINARY_DIR}/man/${prog}.1.gz)
    add_custom_command(OUTPUT ${_page}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/man
      COMMAND ${TCPSTORE_HELP2MAN} --no-info --no-discard-stderr
              --version-string=${PROJECT_VERSION} --section=1
              "--name=${_tcpstore_man_name_${prog}}"
              --include=${PROJECT_SOURCE_DIR}/packaging/${prog}.h2m
              --output=${PROJECT_BINARY_DIR}/man/${prog}.1 $<TARGET_FILE:${prog}>
      COMMAND gzip -9nf ${PROJECT_BINARY_DIR}/man/${prog}.1
      DEPENDS ${prog} ${PROJECT_SOURCE_DIR}/packaging/${prog}.h2m
      COMMENT "help2man: ${prog}.1"
      VERBATIM)
    list(APPEND _tcpstore_man_pages ${_page})
  endforeach()
  add_custom_target(tcpstore_man ALL DEPENDS ${_tcpstore_man_pages})
  install(FILES ${_tcpstore_man_pages}
    DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT man)
else()
  message(STATUS "help2man not found: no man pages (apt-get install help2man)")
endif()

if(TCPSTORE_INSTALL_SERVICE)
  configure_file(${PROJECT_SOURCE_DIR}/packaging/tcpstore-server.service.in
    ${PROJECT_BINARY_DIR}/packaging/tcpstore-server.service @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/packaging/tcpstore-server.service
    DESTINATION lib/systemd/system COMPONENT service)
  install(FILES ${PROJECT_SOURCE_DIR}/packaging/tcpstore-server.default
    DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/default RENAME tcpstore-server
    COMPONENT service)
endif()
