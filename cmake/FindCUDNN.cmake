# Find cuDNN (9.x): defines CUDNN_FOUND, CUDNN_VERSION and the target CUDNN::cudnn.
# Hints: CUDNN_ROOT, CUDAToolkit_ROOT, the CUDA toolkit's own include/lib dirs.
find_package(CUDAToolkit QUIET)
find_path(CUDNN_INCLUDE_DIR cudnn.h
  HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}
  PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY cudnn
  HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
  PATH_SUFFIXES lib lib64 lib/x64)
if(CUDNN_INCLUDE_DIR)
  foreach(h cudnn_version.h cudnn.h)
    if(EXISTS "${CUDNN_INCLUDE_DIR}/${h}")
      file(STRINGS "${CUDNN_INCLUDE_DIR}/${h}" _cudnn_defs REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
      if(_cudnn_defs)
        string(REGEX REPLACE ".*CUDNN_MAJOR +([0-9]+).*" "\\1" _maj "${_cudnn_defs}")
        string(REGEX REPLACE ".*CUDNN_MINOR +([0-9]+).*" "\\1" _min "${_cudnn_defs}")
        string(REGEX REPLACE ".*CUDNN_PATCHLEVEL +([0-9]+).*" "\\1" _pat "${_cudnn_defs}")
        set(CUDNN_VERSION "${_maj}.${_min}.${_pat}")
        break()
      endif()
    endif()
  endforeach()
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR VERSION_VAR CUDNN_VERSION)
if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES IMPORTED_LOCATION "${CUDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
