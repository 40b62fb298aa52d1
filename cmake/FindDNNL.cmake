# Find oneDNN without its CMake config: defines DNNL_FOUND, DNNL_VERSION and
# the target DNNL::dnnl. Debian's dnnl-config.cmake is built with the OpenCL
# GPU runtime and calls find_package(OpenCL REQUIRED), a hard configure
# error when ocl-icd-opencl-dev (which libdnnl-dev only recommends) is
# missing; QUIET cannot catch it. The CPU engine Kiln uses needs neither
# the config nor OpenCL at build time: the header and the library suffice.
# Hints: DNNL_ROOT.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h HINTS ${DNNL_ROOT} $ENV{DNNL_ROOT} PATH_SUFFIXES include)
find_library(DNNL_LIBRARY dnnl HINTS ${DNNL_ROOT} $ENV{DNNL_ROOT} PATH_SUFFIXES lib lib64)
if(DNNL_INCLUDE_DIR AND EXISTS "${DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h")
  file(STRINGS "${DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _dnnl_defs
    REGEX "#define DNNL_VERSION_(MAJOR|MINOR|PATCH) +[0-9]+")
  if(_dnnl_defs)
    string(REGEX REPLACE ".*DNNL_VERSION_MAJOR +([0-9]+).*" "\\1" _maj "${_dnnl_defs}")
    string(REGEX REPLACE ".*DNNL_VERSION_MINOR +([0-9]+).*" "\\1" _min "${_dnnl_defs}")
    string(REGEX REPLACE ".*DNNL_VERSION_PATCH +([0-9]+).*" "\\1" _pat "${_dnnl_defs}")
    set(DNNL_VERSION "${_maj}.${_min}.${_pat}")
  endif()
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(DNNL REQUIRED_VARS DNNL_LIBRARY DNNL_INCLUDE_DIR VERSION_VAR DNNL_VERSION)
if(DNNL_FOUND AND NOT TARGET DNNL::dnnl)
  add_library(DNNL::dnnl UNKNOWN IMPORTED)
  set_target_properties(DNNL::dnnl PROPERTIES IMPORTED_LOCATION "${DNNL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${DNNL_INCLUDE_DIR}")
endif()
mark_as_advanced(DNNL_INCLUDE_DIR DNNL_LIBRARY)
