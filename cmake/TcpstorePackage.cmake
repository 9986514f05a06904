# `cpack -G DEB` in a build configured with -DCMAKE_INSTALL_PREFIX=/usr builds one .deb with
# everything `cmake --install` installs (packaging/build-deb.sh does both). Dependencies come
# from dpkg-shlibdeps (needs dpkg-dev and file); the development dependencies of the static
# libraries and the CMake package are Suggests.
set(CPACK_PACKAGE_NAME tcpstore)
set(CPACK_PACKAGE_VENDOR "tcpstore")
set(CPACK_PACKAGE_CONTACT "tcpstore maintainers <tcpstore@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "c10d TCPStore server, client and library for PyTorch 1.13 and 2.x")
set(CPACK_PACKAGE_DESCRIPTION "tcpstore implements the TCPStore key-value protocol that\n\
PyTorch's torch.distributed uses to rendezvous: tcpstore-server (libuv, both\n\
wire dialects on one port, systemd unit), tcpstore-cli, the C++ and C client\n\
library libtcpstore.so, and the static libraries, headers, CMake package and\n\
pkg-config files to build against them.")
set(CPACK_STRIP_FILES ON)
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "libuv1-dev (>= 1.44), libfmt-dev, pkg-config, cmake")
if(TCPSTORE_INSTALL_SERVICE)
  set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/packaging/conffiles)
endif()
include(CPack)
